"""What a training step asks of a GPU, counted without one: a dry run of the CUDA backend's host code.

The step of the speed tables (repro.steptime: zero_grad, forward, loss, backward, optimizer step) runs on
torch's meta device with kernels.cuda as its backend (kernels.cuda.dry_run): shapes, dtypes and strides
are real, nothing is computed. Counted per step:

* device ops: torch ops on the device that launch work (views, detaches and bare allocations do not);
  each is one kernel launch or more (a convolution's backward is two);
* backend launches: the NVRTC kernels kernels.cuda launches (quantize, im2col, ...), by name;
* host reads: every op that makes the host wait for the device (.item(), bool(), nonzero, a copy to the
  host), with the line that asked, in both steps; a read gives zeros here so that the step goes on. The one
  read a step is allowed is the non-finite flag's, once per iteration (kernels.errors.raise_if_nonfinite);
* peak memory: the most bytes of device storage live at once during the step, above what was live
  before it (parameters, optimizer state, the batch), as torch's allocator would count it without its
  rounding, caches and library workspaces: an estimate.

Run as ``python -m repro.step_audit --model resnet50 --batch 64 --size 224 fp32 daiq ui8 gq``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kernels.cuda.dry_run import DRY_RUN_ARCH, dry_run
from repro import steptime

DEVICE = torch.device("meta")
# ops that launch nothing: views, aliases and bare allocations
NO_LAUNCH = frozenset(
    "alias as_strided detach empty empty_like empty_strided expand lift_fresh new_empty new_empty_strided "
    "permute select slice split split_with_sizes squeeze t transpose unbind unfold unsqueeze view "
    "_reshape_alias _unsafe_view".split()
)
# ops whose result the host must wait for
HOST_READS = frozenset("_local_scalar_dense equal is_nonzero masked_select nonzero unique".split())
ALLOWED_READS = "kernels/errors.py"  # the non-finite flag, read once per iteration by design
_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class HostRead:
    op: str
    where: str  # file:line function of the project's code that asked

    @property
    def allowed(self) -> bool:
        return self.where.startswith(ALLOWED_READS + ":")


@dataclass
class StepAudit:
    ops: collections.Counter = field(default_factory=collections.Counter)
    sites: collections.Counter = field(default_factory=collections.Counter)  # device ops by asking line
    launches: collections.Counter = field(default_factory=collections.Counter)
    reads: list[HostRead] = field(default_factory=list)
    peak_bytes: int = 0

    @property
    def device_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def kernel_launches(self) -> int:
        return sum(self.launches.values())

    @property
    def syncs(self) -> list[HostRead]:
        """The host reads beyond the one allowed per iteration."""
        return [r for r in self.reads if not r.allowed]


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _to_host(name: str, args, kwargs) -> bool:
    """A copy from the device to the host (a host-to-device copy does not wait for the device)."""
    if name == "_to_copy":
        return args[0].device == DEVICE and kwargs.get("device") not in (None, DEVICE)
    return name == "copy_" and args[0].device != DEVICE and args[1].device == DEVICE


def _caller() -> str:
    """The innermost frame of the project's own code (repro, kernels, tasks, tables, tests)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename).resolve()
        if not path.is_relative_to(_ROOT) or path.name == "step_audit.py":
            continue
        if path.parts[len(_ROOT.parts)] in ("repro", "kernels", "tasks", "tables", "tests"):
            return f"{path.relative_to(_ROOT)}:{frame.lineno} {frame.name}"
    return "outside the project"


class _Memory:
    """Device storages live now (weak references: a storage leaves when torch frees it)."""

    def __init__(self):
        self.live, self.peak, self._seen = 0, 0, weakref.WeakSet()

    def track(self, t: torch.Tensor) -> None:
        if t.device != DEVICE:
            return
        s = t.untyped_storage()
        if s in self._seen:
            return
        self._seen.add(s)
        n = s.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(s, self._free, n)

    def _free(self, n: int) -> None:
        self.live -= n


class _Counting(TorchDispatchMode):
    def __init__(self, audit: StepAudit, memory: _Memory, sites: bool = False):
        super().__init__()
        self.audit, self.memory, self.sites = audit, memory, sites

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        inputs = _tensors((args, kwargs))
        on_device = any(t.device == DEVICE for t in inputs) or kwargs.get("device") == DEVICE
        to_host = on_device and _to_host(name, args, kwargs)
        if on_device and name in HOST_READS or to_host:
            self.audit.reads.append(HostRead(name, _caller()))
            # meta tensors hold no data: the host gets zeros, so that the step goes on
            if name == "_local_scalar_dense":
                return 0 if not inputs[0].is_floating_point() else 0.0
            if name == "copy_":
                return args[0]
            if name == "_to_copy":
                dtype = kwargs.get("dtype") or args[0].dtype
                return torch.zeros(args[0].shape, dtype=dtype, device=kwargs["device"])
        out = func(*args, **kwargs)
        outputs = _tensors(out)
        if (on_device or any(t.device == DEVICE for t in outputs)) and name not in NO_LAUNCH:
            if func.namespace == "aten":
                self.audit.ops[name] += 1
                if self.sites:
                    self.audit.sites[_caller()] += 1
        for t in outputs:
            self.memory.track(t)
        return out


def _live_before(runner) -> list[torch.Tensor]:
    params = list(runner.model.parameters())
    ts = params + [p.grad for p in params if p.grad is not None]
    for state in runner.optimizer.state.values():
        ts += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return ts


def audit_step(variant: steptime.Variant, model: str = "resnet50", batch: int = 64, size: int = 224,
               num_classes: int = 1000, sites: bool = False, half: bool = False) -> StepAudit:  # fmt: skip
    """One step of `variant` counted after a first step (which creates the optimizer's state); host reads
    of both steps. half: the model and the batch in float16 (AMP's activations and INT8 layers under fp16
    autocast, which the meta device lacks; without AMP's fp32 master weights)."""
    if variant.amp:
        raise ValueError("the meta device has no autocast: a dry run takes FP32 and INT8 variants")
    if model not in steptime.MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(steptime.MODELS)}")
    with dry_run() as launches:
        with torch.device(DEVICE):
            base = steptime.MODELS[model](num_classes=num_classes)
        runner = steptime.Runner(variant, base, DEVICE, num_classes)
        if half:
            runner.model.half()  # in place: the optimizer keeps the same parameters
        x = torch.empty((batch, 3, size, size), device=DEVICE, dtype=torch.float16 if half else None)
        y = torch.empty((batch,), dtype=torch.int64, device=DEVICE)
        warm, memory = StepAudit(), _Memory()
        with _Counting(warm, memory):
            runner.step(x, y)
        audit, memory = StepAudit(), _Memory()
        launches.clear()
        for t in _live_before(runner) + [x, y]:
            memory.track(t)
        before = memory.live
        with _Counting(audit, memory, sites):
            runner.step(x, y)
        audit.launches.update(launches)
        audit.reads[:0] = warm.reads  # a read in the first step counts too (it may be a period's first)
        audit.peak_bytes = memory.peak - before
    return audit


def variant_named(name: str) -> steptime.Variant:
    if name == "fp32":
        return steptime.Variant("fp32", "FP32")
    if name in ("fp16", "bf16"):
        raise ValueError("the meta device has no autocast: a dry run takes fp32 and INT8 methods")
    return steptime.int8_variant(name)


def report(audits: dict[str, StepAudit]) -> str:
    lines = ["variant   device ops   kernels.cuda launches   host reads, 2 steps (allowed)   "
             "est. peak step memory"]  # fmt: skip
    for name, a in audits.items():
        allowed = len(a.reads) - len(a.syncs)
        counts = f"{a.device_ops:10d}   {a.kernel_launches:21d}   {len(a.reads):10d} ({allowed})"
        lines.append(f"{name:<9} {counts}                   {a.peak_bytes / 2**30:8.2f} GiB")
    for name, a in audits.items():
        for r in a.syncs:
            lines.append(f"{name}: host read {r.op} at {r.where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.step_audit", description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", help="fp32 or INT8 method names (daiq, ui8, gq, ...)")
    parser.add_argument("--model", default="resnet50", choices=sorted(steptime.MODELS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument(
        "--half",
        action="store_true",
        help="model and batch in float16 (AMP's activations; INT8 under fp16 autocast)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=0,
        help="also list each variant's N most frequent ops and the lines that issue most",
    )
    args = parser.parse_args(argv)
    try:
        audits = {v: audit_step(variant_named(v), args.model, args.batch, args.size, sites=args.top > 0,
                                half=args.half) for v in args.variants}  # fmt: skip
    except (ValueError, KeyError) as e:
        print(f"repro.step_audit: {e}", file=sys.stderr)
        return 2
    model = f"{args.model}, batch {args.batch} at {args.size} px" + (", float16 model" if args.half else "")
    print(f"{model}: one training step as the speed tables time it, a dry run of the CUDA backend "
          f"(sm_{DRY_RUN_ARCH}) on the meta device, counted, not timed")  # fmt: skip
    if args.half:
        audits = {("fp16" if k == "fp32" else f"{k}+fp16"): a for k, a in audits.items()}
    print(report(audits))
    for name, a in audits.items() if args.top else ():
        print(f"\n{name}: " + ", ".join(f"{op} {n}" for op, n in a.ops.most_common(args.top)))
        print(f"{name} launches: " + ", ".join(f"{k} {n}" for k, n in a.launches.most_common()))
        print(f"{name} by line: " + ", ".join(f"{k} {n}" for k, n in a.sites.most_common(args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
