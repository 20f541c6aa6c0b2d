"""What an INT8 backend is: the one interface every device's backend implements in full.

A backend is a module (kernels.cpu, kernels.cuda) with these functions; ``kernels.get_backend(device)``
picks it. Operands are int8 codes in [-127, 127], products exact int32 (the int32 contract of
kernels.reference: exact while the reduction length K < 133,144); quantization has repro.quant's
semantics (nearest rounding bit-identical, stochastic rounding from the shared Philox stream). A NaN or
Inf in a quantizer's input raises NonFiniteError, at once (CPU) or at the next
``kernels.errors.raise_if_nonfinite`` (GPU, no host synchronisation inside a step).
"""

from __future__ import annotations

from typing import Protocol

import torch

QMAX = 127  # int8 codes are symmetric: [-QMAX, QMAX]
# the float dtypes the quantizers read and the epilogue writes, as the native and CUDA kernels number them
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class Backend(Protocol):
    # --- quantization
    def absmax(self, x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
        """max|x| as float32: 0-d, or one value per slice along `axis`."""

    def channel_stats(self, x: torch.Tensor, axis: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """max|x| and the population standard deviation per slice along `axis` (None: whole tensor)."""

    def quantize(self, x, scale, axis=None, rounding="nearest", generator=None, above=None):
        """int8 codes of x clipped to [-scale, scale] (per tensor or per slice along `axis`), x's layout;
        above=(dim, thresholds) also counts |x| > thresholds[c] per slice along dim: (codes, counts)."""

    def absmax_quantize(self, x, axis=None, rounding="nearest", generator=None):
        """(codes, s) with s = max|x|, fused."""

    def dequantize(self, acc, scale, axis=None, dtype=torch.float32, inplace=False) -> torch.Tensor:
        """The epilogue: int32 acc * scale (per tensor or per slice along `axis`) as float32 or the
        autocast dtype, in acc's layout."""

    # --- products (int8 in, exact int32 out)
    def conv_forward(self, xq, wq, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor: ...

    def conv_input_grad(self, gq, wq, input_shape, stride=1, padding=0, dilation=1, groups=1): ...

    def conv_weight_grad(self, xq, gq, weight_shape, stride=1, padding=0, dilation=1, groups=1): ...

    def linear_forward(self, xq, wq) -> torch.Tensor: ...

    def linear_input_grad(self, gq, wq) -> torch.Tensor: ...

    def linear_weight_grad(self, xq, gq) -> torch.Tensor: ...


REQUIRED = tuple(name for name in vars(Backend) if not name.startswith("_"))


def missing(backend) -> list[str]:
    """The interface functions a backend module lacks (the tests require none)."""
    return [name for name in REQUIRED if not callable(getattr(backend, name, None))]
