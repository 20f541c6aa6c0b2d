"""The CUDA products' operand checks, a convolution's geometry and its im2col / col2im kernels
(csrc/im2col.cu, csrc/col2im.cu): 1/2/3-D
convolutions as the 3-D one the kernels run, columns at any element strides, groups as a batch dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..geometry import conv_geometry
from . import runtime

CHUNK_BYTES = 256 << 20  # conv: batch chunk such that a chunk's columns take about this much memory


def check_operands(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.int8:
            raise TypeError(f"expected an int8 tensor, got {t.dtype}")
    runtime.check_device(*tensors)


def check_linear(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    check_operands(a, b)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{what}: expected 2-D operands, got {tuple(a.shape)} and {tuple(b.shape)}")


def check_int32_size(*sizes: int) -> None:
    for v in sizes:
        if v >= 2**31:
            raise ValueError(f"dimension {v} exceeds the kernels' 32-bit sizes")


@dataclass(frozen=True)
class ConvGeometry:
    """A 1/2/3-D convolution as the 3-D one the kernels run (unit leading dims for 1-D and 2-D)."""

    n: int
    cin: int
    cout: int
    groups: int
    spatial: tuple[int, int, int]
    out: tuple[int, int, int]
    k: tuple[int, int, int]
    s: tuple[int, int, int]
    p: tuple[int, int, int]
    d: tuple[int, int, int]

    @classmethod
    def of(cls, x_shape, w_shape, stride, padding, dilation, groups) -> ConvGeometry:
        nd, s, p, d, k, out = conv_geometry(x_shape, w_shape, stride, padding, dilation, groups)
        lead = 3 - nd

        def pad3(v, fill):
            return (fill,) * lead + tuple(int(a) for a in v)

        return cls(
            int(x_shape[0]), int(x_shape[1]), int(w_shape[0]), int(groups),
            pad3(x_shape[2:], 1), pad3(out, 1), pad3(k, 1), pad3(s, 1), pad3(p, 0), pad3(d, 1),
        )  # fmt: skip

    @property
    def positions(self) -> int:  # P, output positions per image
        return math.prod(self.out)

    @property
    def kg(self) -> int:  # the reduction length of the forward pass: Cin/groups * prod(kernel)
        return self.cin // self.groups * math.prod(self.k)

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups

    def chunk(self, bytes_per_image: int, budget: int | None = None) -> int:
        """Images per chunk: the chunk's buffer about ``budget`` bytes, and the GEMM batch of
        images x groups within one launch."""
        budget = CHUNK_BYTES if budget is None else budget
        by_memory = max(1, budget // max(1, bytes_per_image))
        by_grid = max(1, runtime.MAX_GRID_YZ // self.groups)
        if self.groups > runtime.MAX_GRID_YZ:
            raise ValueError(f"groups={self.groups} exceeds one launch's {runtime.MAX_GRID_YZ}")
        return max(1, min(self.n, by_memory, by_grid))

    def kernel_args(self, nimg: int) -> tuple:
        i32 = np.int32
        return (
            i32(nimg), i32(self.cin), i32(self.groups),
            *(i32(v) for v in (*self.spatial, *self.out, *self.k, *self.s, *self.p, *self.d)),
        )  # fmt: skip


def im2col(x: torch.Tensor, cols: torch.Tensor, geo: ConvGeometry, strides: tuple[int, int, int, int]):
    """cols[n, g, p, kidx] at the element strides (sN, sG, sP, sK) from contiguous x (im2col.cu)."""
    nimg = x.shape[0]
    total = nimg * geo.groups * geo.positions * geo.kg
    args = (x, cols, *geo.kernel_args(nimg), *(np.int64(v) for v in strides))
    runtime.launch("im2col", "im2col", (runtime.grid_1d(total), 1, 1), (runtime.THREADS, 1, 1), args)


def col2im(dcols: torch.Tensor, dx: torch.Tensor, geo: ConvGeometry, strides: tuple[int, int, int, int]):
    """dx (contiguous) = the gather-sum of dcols[n, g, p, kidx] at strides (sN, sG, sP, sK) (col2im.cu)."""
    nimg = dx.shape[0]
    total = dx.numel()
    args = (dcols, dx, *geo.kernel_args(nimg), *(np.int64(v) for v in strides))
    runtime.launch("col2im", "col2im", (runtime.grid_1d(total), 1, 1), (runtime.THREADS, 1, 1), args)
