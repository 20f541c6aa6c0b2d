"""Time training steps side by side: forward, backward and whole iteration per variant, and peak memory.

A variant is one way of training the same network: FP32, FP16 (autocast + GradScaler; bf16 autocast on
the CPU, which has no fast fp16), or INT8 with a method of the registry. Every variant gets its own copy
of one model (same initial weights), one fixed batch on the device, SGD with momentum and weight decay.
Machines are noisy, so the variants are interleaved round by round, the warm-up rounds are dropped and
the device is synchronised before every clock read; the caller takes medians.

One round of one variant, clocks t0..t3 (each after a synchronisation):
    t0  zero_grad, forward, loss  t1  backward  t2  optimizer step (and the scaler's update)  t3
forward = t1 - t0, backward = t2 - t1, iteration = t3 - t0.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
import torchvision

from kernels import inductor_bool_store
from repro import heap
from repro.layers import quantize_model
from repro.lr_scaling import LayerLrScaling
from repro.methods import build_method

MODELS = {
    "resnet18": torchvision.models.resnet18,
    "resnet50": torchvision.models.resnet50,
    "mobilenet_v2": torchvision.models.mobilenet_v2,
    # grouped convolutions (issue 64's "depthwise and grouped" target): 4 to 32 channels a group
    "resnext50_32x4d": torchvision.models.resnext50_32x4d,
    "regnet_x_400mf": torchvision.models.regnet_x_400mf,
    "regnet_y_400mf": torchvision.models.regnet_y_400mf,
}
PHASES = ("forward", "backward", "iteration")


@dataclass(frozen=True)
class Variant:
    """One row of a speed table. method None: the plain float model (no layer swapped)."""

    name: str
    precision: str  # "FP32", "FP16" (or its CPU stand-in bf16), "INT8"
    method: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    amp: str | None = None  # autocast dtype: "float16" or "bfloat16"
    channels_last: bool = True
    tf32: bool = False  # CUDA: TF32 tensor cores for fp32 convolutions and matmuls
    compiled: bool = False  # the model under torch.compile (after its first, eager, warm-up step)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "precision": self.precision,
            "method": self.method,
            "options": dict(self.options),
            "amp": self.amp,
            "channels_last": self.channels_last,
            "tf32": self.tf32,
        }
        if self.compiled:  # only then: the keys of eager timing cells stay as they were
            out["compiled"] = True
        return out


def float_variants(device: torch.device) -> list[Variant]:
    """What a float user runs: FP32 (and FP32 with TF32 on CUDA), and mixed precision."""
    if device.type == "cuda":
        return [
            Variant("fp32", "FP32", channels_last=False),
            Variant("tf32", "FP32", channels_last=False, tf32=True),
            Variant("fp16", "FP16", amp="float16"),
        ]
    return [Variant("fp32", "FP32"), Variant("bf16", "FP16", amp="bfloat16")]


def int8_variant(method: str, **options: Any) -> Variant:
    name = method if not options else method + "[" + ",".join(f"{k}={v}" for k, v in options.items()) + "]"
    return Variant(name, "INT8", method=method, options=options)


COMPILED_SUFFIX = "+compile"


def compiled_copies(variants: Sequence[Variant]) -> list[Variant]:
    """Each variant again under torch.compile, named "<name>+compile"."""
    return [dataclasses.replace(v, name=v.name + COMPILED_SUFFIX, compiled=True) for v in variants]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """One variant's model, optimizer and step."""

    # the clock of the step's phases: wall time; time.process_time (the process's CPU seconds) where the
    # machine is shared and the run has one thread (repro step-time --cpu-time)
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self, variant: Variant, base: torch.nn.Module, device: torch.device, num_classes: int):
        self.variant, self.device = variant, device
        model = copy.deepcopy(base)
        fmt = torch.channels_last if variant.channels_last else torch.contiguous_format
        model = model.to(device=device, memory_format=fmt)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        if variant.method is not None:
            method = build_method(variant.method, **dict(variant.options))
            # channels_last_out: as the classification task trains (torch's own ops follow every layer)
            quantize_model(model, method, channels_last_out=True)
            optimizer = method.make_optimizer(model, optimizer) or optimizer
            LayerLrScaling(model, optimizer)
        self.model, self.optimizer = model, optimizer
        self.amp = getattr(torch, variant.amp) if variant.amp else None
        self.scaler = torch.amp.GradScaler(device.type) if variant.amp == "float16" else None
        self.memory_format = fmt
        self.compiled = False
        self.num_classes = num_classes

    def _flags(self) -> None:
        if self.device.type == "cuda":  # global switches, set before every step of every variant
            torch.backends.cuda.matmul.allow_tf32 = self.variant.tf32
            torch.backends.cudnn.allow_tf32 = self.variant.tf32

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
        """One training step; (forward, backward, iteration) seconds. A compiled variant's first step
        runs eagerly, then the model is compiled: the method state a compiled step updates in place
        (DAIQ's s_c, UI8's clip value) exists after one step, so compiling never meets it missing."""
        if self.variant.compiled and not self.compiled:
            times = self._step(x, y)
            inductor_bool_store.apply()  # every compiled variant, FP32 too: the comparison stays fair
            self.model, self.compiled = torch.compile(self.model), True
            return times
        return self._step(x, y)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
        self._flags()
        x = x.contiguous(memory_format=self.memory_format)
        _sync(self.device)
        t0 = self.clock()
        self.optimizer.zero_grad(set_to_none=True)
        # no autocast context at all without amp: torch.autocast rejects devices it has no policy for (meta)
        with torch.autocast(self.device.type, dtype=self.amp) if self.amp else contextlib.nullcontext():
            loss = F.cross_entropy(self.model(x), y)
        _sync(self.device)
        t1 = self.clock()
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        _sync(self.device)
        t2 = self.clock()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        _sync(self.device)
        t3 = self.clock()
        return t1 - t0, t2 - t1, t3 - t0


def peak_step_memory(runner: Runner, x: torch.Tensor, y: torch.Tensor) -> float | None:
    """MB a step needs above what is allocated before it (parameters, optimizer state, the batch); None
    where it cannot be read. CUDA: torch's allocator peak. CPU: the process's peak resident set (VmHWM),
    reset through /proc/self/clear_refs (Linux) after malloc's free heap memory is given back
    (malloc_trim), with glibc's malloc told to map every block of 64 KB and more on its own
    (cpu_memory_accounting), so that freed activations leave the resident set."""
    if runner.device.type == "cuda":
        _sync(runner.device)
        torch.cuda.reset_peak_memory_stats(runner.device)
        before = torch.cuda.memory_allocated(runner.device)
        runner.step(x, y)
        return (torch.cuda.max_memory_allocated(runner.device) - before) / 2**20
    try:
        # memory freed earlier (the timing rounds, another variant) stays in malloc's heap, resident: a
        # step that reuses it would show no growth (ResNet-50's bf16 rows read 0 MB); give it back first
        trim = heap.libc_function("malloc_trim")
        if trim is not None:
            trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        # the peak's own value at the reset; the kernel's resident-set counters are per-thread caches
        # synced lazily, so a step that only frees can still read a few hundred KB lower: clamped at 0
        # (the speed table printed '-0')
        before = _status_kb("VmHWM")
        runner.step(x, y)
        return max(0.0, (_status_kb("VmHWM") - before) / 1024)
    except (OSError, ValueError, KeyError):
        return None


@contextlib.contextmanager
def cpu_memory_accounting():
    """glibc keeps freed heap memory resident, so a step that reuses it shows no growth of the resident
    set. Inside: blocks of 64 KB and more are mmap-ed and unmapped when freed. On leaving, glibc's
    largest dynamic threshold (32 MB), where a long training process ends up anyway, or the reuse of
    freed memory (repro.heap) where the process had it."""
    heap.map_big_blocks(64 << 10, 128 << 10)
    try:
        yield
    finally:
        heap.map_big_blocks(32 << 20, 64 << 20)
        if heap.applied():
            heap.reuse_freed_memory()


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def time_variants(
    variants: Sequence[Variant],
    *,
    model: str = "resnet50",
    batch: int,
    size: int,
    device: torch.device,
    rounds: int,
    warmup: int,
    num_classes: int = 1000,
    done: Mapping[str, Mapping[str, list[float]]] | None = None,
    on_round: Callable[[int, dict], None] | None = None,
    on_step: Callable[[], None] | None = None,
    memory: bool = True,
    clock: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Interleaved timing of every variant: {"samples": {variant: {phase: [seconds per round]}},
    "peak_memory_mb": {variant: MB or None}}.

    done: samples of rounds already measured (a resumed run adds rounds until there are `rounds`);
    on_round(rounds measured so far, samples) is called after every round (to save progress);
    on_step() after every step, warm-up included (a progress bar); clock: the runners' clock (Runner.clock).
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    torch.manual_seed(0)
    base = MODELS[model](num_classes=num_classes)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((batch, 3, size, size), generator=gen).to(device)
    y = torch.randint(0, num_classes, (batch,), generator=gen).to(device)
    if any(v.compiled for v in variants):
        # every compiled copy of the network takes its own cache entries of the same code objects
        limit = 8 * len(variants)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
    runners = {v.name: Runner(v, base, device, num_classes) for v in variants}
    if clock is not None:
        for runner in runners.values():
            runner.clock = clock
    del base
    samples = {v.name: {p: list((done or {}).get(v.name, {}).get(p, [])) for p in PHASES} for v in variants}
    have = min(len(samples[v.name]["iteration"]) for v in variants)
    for s in samples.values():  # a round counts only when every variant finished it
        for p in PHASES:
            del s[p][have:]
    for i in range(warmup + max(0, rounds - have)):
        for name, runner in runners.items():
            times = runner.step(x, y)
            if i >= warmup:
                for p, t in zip(PHASES, times, strict=True):
                    samples[name][p].append(t)
            if on_step:
                on_step()
        if i >= warmup and on_round:
            on_round(have + i - warmup + 1, samples)
    peaks = {name: None for name in runners}
    if memory:
        with cpu_memory_accounting() if device.type == "cpu" else contextlib.nullcontext():
            peaks = {name: peak_step_memory(r, x, y) for name, r in runners.items()}
    return {"samples": samples, "peak_memory_mb": peaks}


def medians_ms(samples: Mapping[str, list[float]]) -> dict[str, float]:
    return {p: 1000 * statistics.median(samples[p]) for p in PHASES if samples.get(p)}


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Median over rounds of a[i] / b[i]: both measured in the same round, so slow drifts of the
    machine cancel."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------------------------------
# `repro step-time`: a quick side-by-side timing of bare method names (no table, no cache)


AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def time_steps(
    model_name: str,
    methods: list[str],
    batch: int,
    size: int,
    rounds: int,
    warmup: int = 2,
    device: torch.device | None = None,
    compiled: bool = False,
    cpu_time: bool = False,
) -> dict[str, list[float]]:
    """Iteration seconds per method ("fp32" is the plain float model, "bf16"/"fp16" mixed precision,
    "<method>+bf16" an INT8 method with its float layers under bf16 autocast, an opt-in semantics);
    compiled: each also under torch.compile ("<method>+compile"), timed in the same rounds; cpu_time: the
    process's CPU seconds instead of wall time (on a shared machine, with one thread; CPU only)."""
    if cpu_time and (device or torch.device("cpu")).type != "cpu":
        raise ValueError("cpu_time measures the CPU's work: a GPU step's time is not in it")
    device = device or torch.device("cpu")
    variants = []
    for m in methods:
        method, _, amp = m.partition("+")
        if m in ("bf16", "fp16"):
            variants.append(Variant(m, "FP16", amp=AMP_DTYPES[m]))
        elif m == "fp32":
            variants.append(Variant("fp32", "FP32"))
        elif amp:  # opt-in: the INT8 layers, the float layers under autocast, outputs in amp's dtype
            variants.append(Variant(m, "INT8", method=method, amp=AMP_DTYPES[amp]))
        else:
            variants.append(int8_variant(m))
    if compiled:
        variants += compiled_copies(variants)
    out = time_variants(
        variants, model=model_name, batch=batch, size=size, device=device, rounds=rounds, warmup=warmup,
        num_classes=10, memory=False, clock=time.process_time if cpu_time else None,
    )  # fmt: skip
    return {name: s["iteration"] for name, s in out["samples"].items()}


def report(times: dict[str, list[float]]) -> str:
    base = statistics.median(times["fp32"]) if "fp32" in times else None
    lines = ["method      median ms/step   vs fp32"]
    for method, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{med / base:8.2f}x" if base else "       -"
        lines.append(f"{method:<11} {1000 * med:14.1f}   {ratio}")
    return "\n".join(lines)
