"""Test-only host mirror of the stochastic-rounding noise (kernels/cpu/csrc/philox.h,
kernels/cuda/csrc/philox.cuh):
Philox4x32-10 in numpy, and the uniform u of every element of a tensor under a key.

The stream: a tensor read as rows x L, L its last dimension and a row every index of the other dimensions
in row-major order; element (r, j) takes word j % 4 of philox((r low, r high, j / 4, 0), key) and
u = (word >> 8) * 2^-24.
"""

from __future__ import annotations

import numpy as np


def philox4x32_10(counter, key) -> np.ndarray:
    """Philox4x32-10, vectorized: counter (..., 4) and key (..., 2) uint32 -> (..., 4)."""
    mask = np.uint64(0xFFFFFFFF)
    c = np.asarray(counter, dtype=np.uint64) & mask
    k = np.asarray(key, dtype=np.uint64) & mask
    shape = np.broadcast_shapes(c.shape[:-1], k.shape[:-1])
    c0, c1, c2, c3 = (np.broadcast_to(c[..., i], shape).copy() for i in range(4))
    k0, k1 = (np.broadcast_to(k[..., i], shape).copy() for i in range(2))
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(0x9E3779B9)) & mask
            k1 = (k1 + np.uint64(0xBB67AE85)) & mask
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ k0,
            p1 & mask,
            (p0 >> np.uint64(32)) ^ c3 ^ k1,
            p0 & mask,
        )
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def uniforms(shape, k0: int, k1: int) -> np.ndarray:
    """u of every element of a tensor of `shape` (logical order, float32)."""
    shape = tuple(shape) or (1,)
    length = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    r = np.repeat(np.arange(rows, dtype=np.uint64), length)
    j = np.tile(np.arange(length, dtype=np.uint64), rows)
    zero = np.zeros_like(r)
    ctr = np.stack([r & np.uint64(0xFFFFFFFF), r >> np.uint64(32), j >> np.uint64(2), zero], axis=-1)
    words = philox4x32_10(ctr, np.array([k0, k1], dtype=np.uint64))
    w = words[np.arange(words.shape[0]), (j & np.uint64(3)).astype(np.int64)]
    return ((w >> 8).astype(np.float32) * np.float32(2.0**-24)).reshape(shape)
