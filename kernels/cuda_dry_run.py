"""The CUDA backend's host code run without a GPU: tensors on torch's meta device stand for CUDA tensors.

Inside ``dry_run()`` the meta device gets kernels.cuda as its backend and the backend's kernel launches
are recorded instead of run, so everything the host does in a training step (which kernels it launches,
which torch ops it issues, whether it ever reads a device value) can be counted on a machine with no GPU.
Meta tensors carry shapes, dtypes and strides but no data: nothing is computed. The GPU is assumed to be
an sm_90 one (the cuBLASLt route for ungrouped products, IMMA for grouped ones), and torch's optimizers
take their multi-tensor (foreach) path on the meta device as they do on CUDA.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
from collections.abc import Iterator

import torch

import kernels
from kernels import cuda, errors

DRY_RUN_ARCH = 90


@contextlib.contextmanager
def dry_run(arch: int = DRY_RUN_ARCH) -> Iterator[collections.Counter]:
    """Yields a Counter of the backend's kernel launches by kernel name, filled while inside."""
    launches: collections.Counter = collections.Counter()
    get_backend = kernels.get_backend
    saved = {name: getattr(cuda, name) for name in ("_launch", "_device_cc", "_check_device")}

    def backend_of(device):
        dev = device if isinstance(device, torch.device) else torch.device(device)
        return cuda if dev.type == "meta" else get_backend(dev)

    def check_device(*tensors: torch.Tensor) -> None:
        if any(t.device.type != "meta" for t in tensors):
            raise ValueError("a dry run of kernels.cuda takes meta tensors only")

    optim = importlib.import_module("torch.optim.optimizer")  # the module (torch.optim hides its name)
    optimizer_devices = optim._get_foreach_kernels_supported_devices
    optim._get_foreach_kernels_supported_devices = lambda: [*optimizer_devices(), "meta"]
    kernels.get_backend = backend_of
    cuda._launch = lambda module, kernel, grid, block, args: launches.update([kernel])
    cuda._device_cc = lambda index: arch
    cuda._check_device = check_device
    try:
        yield launches
    finally:
        kernels.get_backend = get_backend
        # the meta device's non-finite flag goes too: raise_if_nonfinite reads every device's flag
        errors._FLAGS.pop(torch.device("meta"), None)
        optim._get_foreach_kernels_supported_devices = optimizer_devices
        for name, fn in saved.items():
            setattr(cuda, name, fn)
