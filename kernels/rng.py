"""Keys of the stochastic-rounding noise: one 64-bit Philox key per quantizer call
(kernels/cpu/csrc/philox.h).

Drawn from torch's CPU generator (the default one, or the one passed), a host operation on every device:
``torch.manual_seed`` makes the noise repeat, every call draws a fresh stream, and a CUDA tensor's key costs
no synchronisation with the GPU.
"""

from __future__ import annotations

import torch

_KEY_BOUND = 2**63 - 1


def next_key(generator: torch.Generator | None = None) -> tuple[int, int]:
    """(low, high) 32-bit words of a fresh key."""
    if generator is not None and generator.device.type != "cpu":
        # a device generator: reading it waits for the device (only tests pass one)
        v = int(torch.randint(0, _KEY_BOUND, (1,), generator=generator, device=generator.device).item())
    else:
        v = int(torch.randint(0, _KEY_BOUND, (1,), generator=generator, dtype=torch.int64))
    return v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF
