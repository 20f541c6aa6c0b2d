"""The process's random number generators as one checkpointable value: Python's, NumPy's, torch's CPU
generator (it also keys the stochastic-rounding noise, kernels.rng) and every CUDA device's.

    state = rng_state()          # plain ints, floats and tensors: loads under torch's weights_only
    set_rng_state(state)
    with rng_preserved(): ...    # the block draws, the streams outside it go on as if it had not run
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "python": [version, list(internal), gauss],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    keys = n["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())  # a resume may have mapped the checkpoint onto a GPU
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Run a block without moving any generator: what it draws is drawn from a copy."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)
