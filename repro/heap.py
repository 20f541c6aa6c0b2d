"""Freed tensor memory kept in the process for the next tensor (glibc's malloc), so big temporaries cost
no page faults.

glibc serves every block above its mmap threshold (which grows to at most 32 MB) with a fresh mmap and
unmaps it when freed, and PyTorch's CPU allocator keeps no cache of its own: every such tensor, each
step, faults its pages in again and the kernel zeroes them. With mmap off (M_MMAP_MAX = 0) and a high
trim threshold, freed blocks stay in malloc's heap and the next tensor reuses them. The usual cure is
jemalloc or tcmalloc by LD_PRELOAD (PyTorch's CPU performance guide); mallopt needs no package and no
preload. The cost: the process keeps its peak heap (docs/measurements.md). glibc still maps a block
that another thread's arena cannot hold, so nothing fails for lack of mmap.

`REPRO_MALLOC=system` leaves glibc's defaults. Applied by the `repro` command (tables.command), so every
table cell, figure run, training and step timing gets it; a process that imports the package alone (an
MMDetection user's) keeps its own allocator settings.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "REPRO_MALLOC"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
GLIBC_MMAP_MAX = 65536  # glibc's default M_MMAP_MAX
KEEP_BYTES = 1 << 30  # free memory at the heap's top given back to the system only beyond this

_applied = False


def libc_function(name: str):
    """glibc's `name` (Linux), or None where the C library lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def reuse_freed_memory() -> bool:
    """Tell malloc to keep freed blocks for reuse (see the module's docstring); True when it took effect.
    Does nothing under REPRO_MALLOC=system or without glibc's mallopt."""
    global _applied
    if os.environ.get(ENV, "").strip().lower() == "system":
        return False
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES))
    return _applied


def applied() -> bool:
    """Whether reuse_freed_memory() is in effect in this process."""
    return _applied


def map_big_blocks(threshold: int, trim: int) -> None:
    """The opposite, for a measurement of a step's own memory (repro.steptime): blocks of `threshold`
    bytes and more mmap-ed and unmapped when freed, heap tops beyond `trim` given back."""
    mallopt = libc_function("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_MAX, GLIBC_MMAP_MAX)
        mallopt(_M_MMAP_THRESHOLD, threshold)
        mallopt(_M_TRIM_THRESHOLD, trim)
