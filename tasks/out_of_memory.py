"""Out of memory, on a GPU or on the host, as one line naming the batch size and the peak memory.

    if is_out_of_memory(err):
        raise RunFailed(out_of_memory_line(where, batch_size, device))

A run that runs out of memory has not diverged: it failed, and says what to change.
"""

from __future__ import annotations

import os
import resource

import torch

GIB = 2**30
# what torch's host allocator (c10's DefaultCPUAllocator) and CUDA's say when an allocation fails
_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


class RunFailed(RuntimeError):
    """A run that ended without a result and is not a divergence (out of memory, a rank that failed or
    stopped responding); its message is one line."""


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _MESSAGES)


def peak_memory(device: torch.device) -> str:
    """The peak memory of this process on `device`: allocated by torch on a GPU, resident on the host."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / GIB
        total = torch.cuda.get_device_properties(device).total_memory / GIB
        return f"peak {peak:.1f} GiB allocated of {total:.1f} GiB on {device}"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # ru_maxrss is in KiB on Linux
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return f"peak {peak:.1f} GiB resident of {total:.1f} GiB host memory"


def out_of_memory_line(err: BaseException, where: str, batch_size, device: torch.device) -> str:
    # torch raises OutOfMemoryError for the GPU; its host allocator a RuntimeError ("DefaultCPUAllocator")
    on = "the GPU" if isinstance(err, torch.OutOfMemoryError) and device.type == "cuda" else "the host"
    device = device if on == "the GPU" else torch.device("cpu")
    return (
        f"out of memory on {on} {where} with batch size {batch_size} per rank ({peak_memory(device)}): "
        "lower the batch size (--cfg-options train_dataloader.batch_size=N) or use a device with more memory"
    )
