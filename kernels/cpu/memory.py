"""Memory of the CPU backend's outputs: channels-last buffers of any rank, and 2 MB pages for large ones.

Outputs of 32 MB and more (fresh mmap-ed memory on every call) are madvise-d for 2 MB transparent huge
pages before they are written: faulting them in 4 KB pages cost more than the int8 work itself.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Sequence

import torch

HUGE_PAGE = 2 << 20  # x86-64 transparent huge page
MADV_HUGEPAGE = 14
_OWN_MAPPING_BYTES = 32 << 20  # glibc's largest mmap threshold (64-bit): bigger blocks are always mmap-ed


@functools.cache
def libc_madvise():
    """libc's madvise (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def huge_pages(t: torch.Tensor) -> torch.Tensor:
    """Ask Linux to back a fresh, not yet written tensor with 2 MB pages (madvise MADV_HUGEPAGE).

    Outputs of tens of MB are fresh mmap-ed memory on every call, and faulting it in 4 KB pages cost
    more than the int8 matmul writing it (25088x128 @ 128x512: 34 ms fresh vs 8 ms into a reused
    buffer, 13 ms with 2 MB pages, measured). Only a hint: without transparent huge pages it does nothing.
    """
    nbytes = t.numel() * t.element_size()
    # from 32 MB, glibc always maps a block on its own (and unmaps it when freed): the hint then stays
    # with this buffer instead of splitting the heap's mapping. Under repro.heap's reuse such blocks come
    # from the heap, resident after the first step: there the hint only marks a heap range
    madvise = libc_madvise() if nbytes >= _OWN_MAPPING_BYTES else None
    if madvise is not None:
        start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        end = (t.data_ptr() + nbytes) // HUGE_PAGE * HUGE_PAGE
        if end > start:
            madvise(start, end - start, MADV_HUGEPAGE)
    return t


def empty_cl(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised (N, C, *spatial) tensor laid out channels-last (C innermost), for any rank."""
    n, c, *sp = shape
    return huge_pages(torch.empty((n, *sp, c), dtype=dtype)).movedim(-1, 1)


def is_cl(t: torch.Tensor) -> bool:
    return t.shape[1] == 1 or t.stride(1) == 1


def cl_row_stride(t: torch.Tensor) -> int | None:
    """The row stride of t (N, C, *spatial) read as the (N * prod(spatial), C) matrix of its channels-last
    rows, when that matrix has unit column stride and one row stride (a channels-last tensor, or a batch
    slice of one); else None."""
    shape, stride = t.shape, t.stride()
    c = shape[1]
    if c > 1 and stride[1] != 1:
        return None
    ld, span = None, None
    for i in (*range(len(shape) - 1, 1, -1), 0):
        if shape[i] == 1:
            continue
        if ld is None:
            ld, span = stride[i], stride[i] * shape[i]
        elif stride[i] != span:
            return None
        else:
            span *= shape[i]
    ld = c if ld is None else ld
    return ld if ld >= c else None


def as_cl(t: torch.Tensor) -> torch.Tensor:
    """t laid out channels-last (a copy unless it already is), for any rank."""
    return t if is_cl(t) else t.movedim(1, -1).contiguous().movedim(-1, 1)
