"""Which device a measurement ran on, in words and as data: every timing output names it.

``resolve(name)`` turns "cuda", "cpu" or None (cuda when present) into a torch.device; ``describe``
gives the GPU name or the CPU model and thread count, with the torch / CUDA / cuDNN versions.
"""

from __future__ import annotations

import functools
import platform

import torch


def resolve(name: str | torch.device | None) -> torch.device:
    """None or "auto": the first CUDA device when there is one, else the CPU. Raises ValueError with one
    line when a CUDA device is asked for and none exists."""
    if name is None or name == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:  # torch's message lists every device type it knows: one line is enough
        raise ValueError(f"unsupported device {name!r}; choose cuda or cpu") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device cuda asked for, but torch sees no CUDA device here (use --device cpu)")
        return torch.device("cuda", dev.index or 0)
    if dev.type != "cpu":
        raise ValueError(f"unsupported device {name!r}; choose cuda or cpu")
    return dev


_ISA = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX512-BF16",
    "amx_int8": "AMX-INT8",
}


@functools.cache
def cpu_model() -> str:
    """The CPU's model name and its vector, int8 and bf16 instruction sets, e.g. "AMD EPYC (AVX2)" or
    "AMD EPYC 9R14 (AVX2, AVX-512, AVX512-VNNI, AVX512-BF16)"."""
    name, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name is None:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    isa = [label for flag, label in _ISA.items() if flag in flags]
    return f"{name} ({', '.join(isa)})" if isa else name


def describe(device: torch.device) -> dict:
    """The device as data: kind, name, threads (CPU), versions."""
    info = {"kind": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        info.update(name=cpu_model(), threads=torch.get_num_threads())
    return info


def label(info: dict) -> str:
    """One line, e.g. "NVIDIA H100 80GB HBM3 (sm 9.0, CUDA 13.0, cuDNN 91300), torch 2.11.0" or
    "AMD EPYC 9R14 96-Core Processor, 2 threads, torch 2.13.0"."""
    if info["kind"] == "cuda":
        return (
            f"{info['name']} (sm {info['capability']}, CUDA {info['cuda']}, cuDNN {info['cudnn']}), "
            f"torch {info['torch']}"
        )
    threads = f"{info['threads']} thread{'s' if info['threads'] != 1 else ''}"
    return f"{info['name']}, {threads}, torch {info['torch']}"
