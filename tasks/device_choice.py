"""Where training runs: `--device cuda|cpu` (make's DEVICE=) for every table, figure and train command.

MMEngine's Runner trains on the first CUDA device when one is visible, else on the CPU. `use_device`
makes that choice the user's: "cuda" where no GPU is visible is a ValueError (one line, exit 2), never a
silent run on the CPU; "cpu" hides the GPUs from this process (CUDA_VISIBLE_DEVICES), which only works
before CUDA is first used. `trained_on()` names the device a run trains on, as each cell's record keeps it.
"""

from __future__ import annotations

import os

import torch

from kernels.bench import devices

CHOICES = ("cuda", "cpu")


def use_device(name: str | None) -> None:
    """Train on `name` from here on (None: as MMEngine chooses, cuda when present)."""
    if name is None:
        return
    if name not in CHOICES:
        raise ValueError(f"unknown device {name!r}; choose {' or '.join(CHOICES)}")
    if name == "cuda":
        devices.resolve("cuda")  # the one-line error where torch sees no GPU
        return
    if torch.cuda.is_initialized():  # CUDA_VISIBLE_DEVICES is read once, when CUDA starts
        raise ValueError("device cpu asked for after this process started CUDA: run it in a new process")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def trained_on() -> str:
    """The device a run started now trains on, e.g. "cpu (AMD EPYC (AVX2))" or "cuda (NVIDIA H200)"."""
    info = devices.describe(devices.resolve(None))
    return f"{info['kind']} ({info['name']})"
