"""INT8 compute backends, the ground floor (imports nothing from repro, tasks or tables).

``get_backend(device)`` returns the package (``kernels.cpu`` or ``kernels.cuda``; ``kernels.traceable``
while torch.compile traces) that implements the one backend interface of kernels.backend on that device:
the quantizer (absmax, per-channel statistics, nearest and stochastic rounding, the dequantizing
epilogue) and exact int8 x int8 -> int32 convolutions and linear layers (forward, input gradient, weight
gradient). ``kernels.reference`` is the exact int64
oracle every backend is tested against.
"""

from __future__ import annotations

import torch

from . import cpu, reference
from .errors import NonFiniteError, raise_if_nonfinite

__all__ = [
    "NUMERICS",
    "NonFiniteError",
    "compiling",
    "cpu",
    "eager_backend",
    "get_backend",
    "raise_if_nonfinite",
    "reference",
]

# The backends' arithmetic and the training step's, as a version: bumped when results change (the
# stochastic-rounding stream, the statistics, the update). The table cells' cache keys hold it, so results
# of two versions are never mixed.
# 2: the fused quantizers' Philox stream keyed per call on the host (element (row, column) of the last
#    dimension), DAIQ's sigma from one-pass moments, UI8's clip search on grids.
# 3: UI8's per-layer learning rate given to the optimizer's step as lr * phi where phi is on the CPU
#    (repro.lr_scaling), where a lerp of the step at lr rounded the weights twice more (kept on GPUs).
NUMERICS = "3"


def compiling() -> bool:
    """True while Dynamo traces. Tests patch this, never torch.compiler.is_compiling: Dynamo looks its own
    rules up by name once per process, and a patched torch function met then is the one it keeps."""
    return torch.compiler.is_compiling()


def get_backend(device: torch.device | str):
    """The INT8 backend module for a torch device (or device string such as "cpu", "cuda:0")."""
    if compiling():
        from . import traceable  # the same interface in torch ops and registered ops: no graph breaks

        return traceable
    return eager_backend(device)


def eager_backend(device: torch.device | str):
    """The device's own backend, also while Dynamo traces (what the registered ops run inside)."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type == "cpu":
        return cpu
    if dev.type == "cuda":
        from . import cuda  # imported on demand: CuPy is loaded only when a CUDA tensor shows up

        return cuda
    raise NotImplementedError(f"no INT8 backend for device type {dev.type!r}; available: 'cpu', 'cuda'")
