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
from kernels.cuda import runtime

DRY_RUN_ARCH = 90


class DryRunLauncher(runtime.GpuLauncher):
    """Counts launches by kernel name instead of running them; meta tensors only; an sm_``arch`` GPU."""

    def __init__(self, arch: int) -> None:
        super().__init__()
        self.arch = arch
        self.launches: collections.Counter = collections.Counter()

    def launch(self, module, kernel, grid, block, args) -> None:
        self.launches.update([kernel])

    def compute_capability(self, device_index) -> int:
        return self.arch

    def check_device(self, tensors) -> None:
        if any(t.device.type != "meta" for t in tensors):
            raise ValueError("a dry run of kernels.cuda takes meta tensors only")


@contextlib.contextmanager
def dry_run(arch: int = DRY_RUN_ARCH) -> Iterator[collections.Counter]:
    """Yields a Counter of the backend's kernel launches by kernel name, filled while inside."""
    get_backend = kernels.get_backend

    def backend_of(device):
        dev = device if isinstance(device, torch.device) else torch.device(device)
        return cuda if dev.type == "meta" else get_backend(dev)

    optim = importlib.import_module("torch.optim.optimizer")  # the module (torch.optim hides its name)
    optimizer_devices = optim._get_foreach_kernels_supported_devices
    optim._get_foreach_kernels_supported_devices = lambda: [*optimizer_devices(), "meta"]
    kernels.get_backend = backend_of
    try:
        with runtime.launching_with(DryRunLauncher(arch)) as launcher:
            yield launcher.launches
    finally:
        kernels.get_backend = get_backend
        # the meta device's non-finite flag goes too: raise_if_nonfinite reads every device's flag
        errors.drop_flag(torch.device("meta"))
        optim._get_foreach_kernels_supported_devices = optimizer_devices
