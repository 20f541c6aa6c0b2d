"""`make gpu-report` (`repro gpu-report`; on a bare GPU machine `PYTHONPATH=. python3 -m tables.gpu_report`):
INT8 training on the GPU at hand, measured in one command that fits a lent GPU's 10-minute slot.

    python -m tables.gpu_report [--device cuda|cpu] [--tiny] [--out results/gpu] [--sections ...]
                                [--rounds 5] [--compile] [--keep]

Writes ``<out>/report.md`` and ``report.json``, naming the device, driver, torch / CUDA / cuDNN / cupy
versions and the commit, with four sections, each written as soon as it is done (a killed run keeps
the sections it finished):

* tests:   the GPU tests (tests/test_cuda_backend.py, tests/test_cuda_compile.py, the layers' GPU
           tests) in a pytest subprocess: counts, and the first failures in full.
* steps:   whole training steps side by side in one process, variants interleaved round by round
           (repro.steptime), medians: ResNet-50 batch 64, ResNet-18 batch 128, MobileNetV2 batch 64 at 224 px;
           FP32, TF32, AMP fp16 (channels-last, GradScaler), INT8 gq / daiq / ui8 in float32 and under
           autocast fp16 (``--compile``: each compiled as well), with the peak memory above the parameters.
* layers:  network totals of ResNet-50's convolutions at batch 64 (repro.layer_cases), forward / input
           gradient / weight gradient: the int8 product alone and with its quantization, against
           cuDNN fp16 channels-last (and fp32).
* profile: torch.profiler over two DAIQ steps of ResNet-50: the 25 costliest kernels by GPU time, the
           kernel launches, and the time the GPU sat idle between kernels.

It needs only torch, torchvision and (for the CUDA backend) cupy: no mmengine, mmcv, mmdet, tqdm or pytest
plugins, which a bare GPU machine lacks. ``--device cpu --tiny`` runs every section on the CPU backend at
a tiny size in about a minute, its timings labelled CPU timings: CI runs it (tests/test_gpu_report.py).
``--keep`` copies the report to results/reference/gpu/<commit>-<device>.{md,json}, never over an
existing file.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch

from atomic_files import write_file
from kernels.bench import devices
from kernels.bench.layers import time_round_robin
from repro import steptime
from repro.layer_cases import OPS, RESNET50, Case, half_name, layer_name, shrink
from tables import provenance

SECTIONS = ("tests", "steps", "layers", "profile")
ROOT = provenance.ROOT
KEPT = ROOT / "results" / "reference" / "gpu"
GPU_TESTS = "tests/test_cuda_backend.py tests/test_cuda_compile.py tests/test_layers.py -k 'cuda or gpu'"
TINY_TESTS = "tests/test_cuda_compile.py -k nvrtc_targets"
INT8_METHODS = ("gq", "daiq", "ui8")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
FIRST_FAILURES = 5


class Sizes:
    """What each section measures: the issue's sizes on a GPU, a tiny stand-in with --tiny."""

    def __init__(self, tiny: bool):
        self.tiny = tiny
        if tiny:
            # MobileNetV2 at batch 2 and 32 px ends in 1x1 maps and diverges within a few steps
            self.steps = [("resnet18", 4, 32), ("mobilenet_v2", 4, 64)]
            self.layers, self.layer_batch = [shrink(layer) for layer in RESNET50], 2
            self.profile = ("resnet18", 4, 32)
        else:
            self.steps = [("resnet50", 64, 224), ("resnet18", 128, 224), ("mobilenet_v2", 64, 224)]
            self.layers, self.layer_batch = list(RESNET50), 64
            self.profile = ("resnet50", 64, 224)


# ----------------------------------------------------------------------------------------------------
# the machine


def _run_text(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: the report says so rather than failing
        return None


def machine(device: torch.device, commit: str | None) -> dict[str, Any]:
    info = devices.describe(device)
    driver = None
    if device.type == "cuda":
        driver = _run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        driver = driver.splitlines()[0].strip() if driver else None
    return {
        "device": info,
        "label": devices.label(info),
        "timings": "GPU timings" if device.type == "cuda" else "CPU timings (not a GPU measurement)",
        "driver": driver,
        "cupy": _version("cupy"),
        "triton": _version("triton"),
        "torchvision": _version("torchvision"),
        "python": platform.python_version(),
        "host_cpu": devices.cpu_model(),
        "commit": commit or provenance.commit(),
        "environment_lock": provenance.lock_hash(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
    }


# ----------------------------------------------------------------------------------------------------
# section: the GPU tests


def run_tests(pytest_args: str, timeout: float) -> dict[str, Any]:
    """The tests in a pytest subprocess with no plugins and no project addopts (a bare machine has neither
    pytest-benchmark nor pytest-randomly); counts from its JUnit XML, the first failures in full."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=-ra", "-p", "no:cacheprovider"]
        cmd += ["--junitxml", str(junit), *shlex.split(pytest_args)]
        env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            code, output = None, f"timed out after {timeout:.0f} s; its output so far:\n{partial}"
        out: dict[str, Any] = {
            "command": "pytest " + pytest_args,
            "exit_code": code,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if not junit.exists():
            out.update(error="pytest wrote no results", output_tail=output[-4000:])
            return out
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        failures, failed = [], []
        for case in suite.iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is None:
                continue
            name = f"{case.get('classname')}::{case.get('name')}"
            failed.append(name)  # every failing test by name: a fix is checked against the whole list
            if len(failures) < FIRST_FAILURES:
                failures.append({"test": name, "message": bad.get("message", ""), "text": bad.text or ""})
        out.update(counts=counts, first_failures=failures, failed_tests=failed)
        return out


# ----------------------------------------------------------------------------------------------------
# section: whole training steps


def step_variants(device: torch.device, compiled: bool) -> list[steptime.Variant]:
    amp = "float16" if device.type == "cuda" else "bfloat16"
    variants = steptime.float_variants(device)
    variants += [steptime.int8_variant(m) for m in INT8_METHODS]
    variants += [steptime.Variant(f"{m}+amp", "INT8", method=m, amp=amp) for m in INT8_METHODS]
    return variants + steptime.compiled_copies(variants) if compiled else variants


def time_steps(device, model: str, batch: int, size: int, rounds: int, warmup: int, compiled: bool):
    variants = step_variants(device, compiled)
    out = steptime.time_variants(
        variants, model=model, batch=batch, size=size, device=device, rounds=rounds, warmup=warmup
    )
    amp = "fp16" if device.type == "cuda" else "bf16"
    base = "tf32" if device.type == "cuda" else "fp32"
    samples = out["samples"]
    rows = []
    for v in variants:
        s = samples[v.name]
        rows.append(
            {
                "variant": v.name,
                "precision": v.precision,
                "ms": steptime.medians_ms(s),
                f"vs_{amp}": steptime.paired_ratio(s["iteration"], samples[amp]["iteration"]),
                f"vs_{base}": steptime.paired_ratio(s["iteration"], samples[base]["iteration"]),
                "peak_mb": out["peak_memory_mb"][v.name],
            }
        )
    return {
        "model": model,
        "batch": batch,
        "size": size,
        "rounds": rounds,
        "amp": amp,
        "base": base,
        "rows": rows,
    }


def step_targets(steps: list[dict]) -> list[str]:
    """The GPU issue's step and memory targets, read off the measured rows (a GPU report's only)."""
    lines = []
    for t in steps:
        amp, rows = t["amp"], {r["variant"]: r for r in t["rows"]}
        for m in INT8_METHODS:
            r = rows[m]
            if t["model"] == "resnet50":
                lines.append(
                    f"ResNet-50 {m}: {r['ms']['iteration']:.1f} ms, {r['vs_tf32']:.2f}x TF32's step "
                    f"({'met' if r['vs_tf32'] <= 1 else 'missed'}: at most TF32), {r[f'vs_{amp}']:.2f}x "
                    f"AMP's ({'met' if r[f'vs_{amp}'] <= 1 else 'missed'}: at most AMP)"
                )
                mem, amp_mem = r["peak_mb"], rows[amp]["peak_mb"]
                if mem is not None and amp_mem:
                    lines.append(
                        f"ResNet-50 {m} peak memory {mem:.0f} MB against AMP's {amp_mem:.0f} "
                        f"({'met' if mem <= amp_mem else 'missed'}: at most AMP's)"
                    )
            if t["model"] == "mobilenet_v2":
                ratio = r[f"vs_{amp}"]
                verdict = "met" if ratio <= 2 else "missed"
                lines.append(f"MobileNetV2 {m}: {ratio:.2f}x AMP's step ({verdict}: at most 2x)")
    return lines


# ----------------------------------------------------------------------------------------------------
# section: ResNet-50's convolutions, network totals


def time_layers(device, layers, batch: int, reps: int) -> dict[str, Any]:
    """Best of `reps` per layer, op and implementation (kernels.bench.layers' round-robin timing over one
    layer's callables), summed over the network with each layer's count."""
    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    impls = ("int8-op", "int8", "fp32", half_name(half))
    if device.type == "cuda":  # the paper's FP32 (a 2080 Ti has no TF32)
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    totals = {op: dict.fromkeys(impls, 0.0) for op in OPS}
    per_layer = []
    for i, layer in enumerate(layers):  # layers[i] is RESNET50[i] or its tiny stand-in
        case = Case(layer, batch, i, device, half)
        calls = [(op, impl) for op in OPS for impl in impls]
        timed = time_round_robin([(c, [functools.partial(case.run, c[1], c[0])]) for c in calls], reps)
        count = layer[1]
        for (op, impl), (ms,) in timed:
            totals[op][impl] += count * ms
        best = {f"{op} {impl}": round(ms, 4) for (op, impl), (ms,) in timed}
        per_layer.append({"layer": layer_name(RESNET50[i]), "count": count, "ms": best})
    return {"batch": batch, "reps": reps, "half": impls[-1], "totals_ms": totals, "layers": per_layer}


# ----------------------------------------------------------------------------------------------------
# section: where a DAIQ step's time goes


def union_length(spans: list[tuple[float, float]]) -> float:
    """The time covered by at least one of the (start, end) intervals: the GPU's busy time when kernels
    overlap (several streams)."""
    busy, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            busy, end = busy + (b - a), b
        elif b > end:
            busy, end = busy + (b - end), b
    return busy


def _is_device_event(e) -> bool:
    return str(getattr(e, "device_type", "")).endswith("CUDA")


def profile_steps(device, model: str, batch: int, size: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    variant = steptime.int8_variant("daiq")
    torch.manual_seed(0)
    base = steptime.MODELS[model](num_classes=1000)
    runner = steptime.Runner(variant, base, device, 1000)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((batch, 3, size, size), generator=gen).to(device)
    y = torch.randint(0, 1000, (batch,), generator=gen).to(device)
    for _ in range(2):  # warm-up: the method's state, NVRTC modules, cuBLASLt heuristics
        runner.step(x, y)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            runner.step(x, y)
    events = prof.events()
    out: dict[str, Any] = {"model": model, "batch": batch, "size": size, "steps": 2, "method": "daiq"}
    if device.type == "cuda":
        kernels = [e for e in events if _is_device_event(e)]
        spans = [(e.time_range.start, e.time_range.end) for e in kernels]
        busy = union_length(spans)
        window = (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else 0.0
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
        launches = sum(1 for e in events if e.name in LAUNCH_CALLS)
        out.update(
            unit="GPU time (kernels, copies and fills on the device)",
            top=_top({k: (sum(v), len(v)) for k, v in by_name.items()}),
            launches_per_step=launches / 2,
            device_ops_per_step=len(kernels) / 2,
            window_ms_per_step=window / 2e3,
            idle_ms_per_step=(window - busy) / 2e3,
            idle_share=(window - busy) / window if window else None,
        )
    else:
        stats = {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}
        out.update(
            unit="self CPU time of the ops (CPU timings: no GPU kernels here)",
            top=_top(stats),
            launches_per_step=None,
            device_ops_per_step=sum(c for _, c in stats.values()) / 2,
            window_ms_per_step=None,
            idle_ms_per_step=None,
            idle_share=None,
        )
    return out


def _top(stats: dict[str, tuple[float, int]], n: int = 25) -> list[dict[str, Any]]:
    total = sum(t for t, _ in stats.values()) or 1.0
    rows = sorted(stats.items(), key=lambda kv: -kv[1][0])[:n]
    return [
        {"name": k, "ms_per_step": t / 2e3, "calls_per_step": c / 2, "share": t / total} for k, (t, c) in rows
    ]


# ----------------------------------------------------------------------------------------------------
# the report


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    versions = ", ".join(
        f"{k} {m[k] or 'n/a'}" for k in ("driver", "cupy", "triton", "torchvision", "python")
    )
    tiny = " (tiny sizes: a check of the report, not a measurement)" if report["tiny"] else ""
    lines = [
        "# INT8 training on a GPU: the report",
        "",
        f"Device: **{m['label']}**; {m['timings']}. {versions}; host CPU {m['host_cpu']}.  ",
        f"Commit {m['commit']}, environment lock {m['environment_lock']}; {m['date_utc']} UTC; "
        f"`{report['command']}`{tiny}",
        "",
    ]
    sections = report["sections"]
    for name in SECTIONS:
        if name not in report["asked"]:
            continue
        s = sections.get(name)
        lines += [f"## {name.capitalize()}", ""]
        if s is None:
            lines += ["Not measured (the run ended before this section).", ""]
            continue
        if "failed" in s:
            lines += [f"The section failed: `{s['failed']}`", ""]
            continue
        lines += {"tests": _md_tests, "steps": _md_steps, "layers": _md_layers, "profile": _md_profile}[name](
            s
        )
        lines += [f"({s['seconds']:.0f} s)", ""]
    return "\n".join(lines)


def _md_tests(s) -> list[str]:
    lines = [f"`{s['command']}`: exit {s['exit_code']}."]
    if "counts" not in s:
        return lines + ["", s.get("error", ""), "", "```", s.get("output_tail", ""), "```", ""]
    c = s["counts"]
    lines += [
        f"**{c['passed']} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped**.",
        "",
    ]
    if s.get("failed_tests"):
        lines += ["Failed: " + ", ".join(f"`{name}`" for name in s["failed_tests"]), ""]
    for f in s["first_failures"]:
        lines += [f"### {f['test']}", "", f"{f['message']}", "", "```", f["text"].rstrip(), "```", ""]
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _md_steps(s) -> list[str]:
    lines = [
        "Every variant trains its own copy of one model on one fixed batch (SGD, momentum, weight decay), "
        "the variants interleaved round by round. `<method>+amp`: the INT8 layers, the float layers "
        "under autocast; `vs X`: the median over rounds of this variant's iteration over X's in that round; "
        "peak MB: what a step allocates above the parameters, optimizer state and batch.",
        "",
    ]
    for t in s["models"]:
        if "failed" in t:
            lines += [
                f"### {t['model']}, batch {t['batch']}, {t['size']} px",
                "",
                f"Failed: `{t['failed']}`",
                "",
            ]
            continue
        amp, base = t["amp"], t["base"]
        lines += [
            f"### {t['model']}, batch {t['batch']}, {t['size']} px, {_plural(t['rounds'], 'round')}, medians",
            "",
            f"| variant | forward ms | backward ms | iteration ms | vs {amp} | vs {base} | peak MB |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in t["rows"]:
            peak = "n/a" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"
            ms = r["ms"]
            lines.append(
                f"| {r['variant']} | {ms['forward']:.1f} | {ms['backward']:.1f} | {ms['iteration']:.1f} | "
                f"{r[f'vs_{amp}']:.2f} | {r[f'vs_{base}']:.2f} | {peak} |"
            )
        lines.append("")
    if s.get("targets"):
        lines += ["Targets (issue 34):", ""] + [f"- {t}" for t in s["targets"]] + [""]
    return lines


def _md_layers(s) -> list[str]:
    half = s["half"]
    lines = [
        f"Network totals over ResNet-50's convolutions and its classifier (batch {s['batch']}, best of "
        f"{s['reps']}, each layer times its count; fp32 without TF32, channels-last), ms:",
        "",
        f"| op | int8 op | int8 with quantization | fp32 | {half} | {half} / int8 op | {half} / int8 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op, t in s["totals_ms"].items():
        lines.append(
            f"| {op} | {t['int8-op']:.2f} | {t['int8']:.2f} | {t['fp32']:.2f} | {t[half]:.2f} | "
            f"{t[half] / t['int8-op']:.2f} | {t[half] / t['int8']:.2f} |"
        )
    return lines + ["", "The per-layer times are in report.json.", ""]


def _md_profile(s) -> list[str]:
    lines = [
        f"{s['model']} {s['method']}, batch {s['batch']}, {s['size']} px, {s['steps']} steps; {s['unit']}."
    ]
    if s["idle_share"] is not None:
        lines.append(
            f"Per step: {s['launches_per_step']:.0f} kernel launches, {s['device_ops_per_step']:.0f} device "
            f"operations, {s['window_ms_per_step']:.1f} ms from the first to the last, of which the GPU sat "
            f"idle {s['idle_ms_per_step']:.1f} ms ({100 * s['idle_share']:.0f}%)."
        )
    else:
        lines.append(f"Per step: {s['device_ops_per_step']:.0f} op calls.")
    lines += ["", "| name | ms per step | calls per step | share |", "|---|---:|---:|---:|"]
    for r in s["top"]:
        name = r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "..."
        lines.append(
            f"| `{name}` | {r['ms_per_step']:.2f} | {r['calls_per_step']:.0f} | {100 * r['share']:.1f}% |"
        )
    return lines + [""]


def earlier_sections(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The sections an earlier run wrote to `out` on the same commit, device and sizes that this run does
    not measure again: a GPU lent for 10 minutes a command can have its report made in parts."""
    try:
        old = json.loads((out / "report.json").read_text())
        same = (
            all(old["machine"][k] == report["machine"][k] for k in ("commit", "label"))
            and old["tiny"] == report["tiny"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    commit = report["machine"]["commit"]
    if not same or "+dirty" in commit or commit.startswith("unknown"):  # then the code may have changed
        return {}
    return {k: v for k, v in old.get("sections", {}).items() if k in SECTIONS and k not in report["asked"]}


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_file(out / "report.json", json.dumps(report, indent=1, default=str))
    write_file(out / "report.md", render(report))


def keep(report: dict[str, Any], out: Path, kept: Path = KEPT) -> list[Path]:
    """Copies of the report under results/reference/gpu/, one per commit and device, never overwritten."""
    m = report["machine"]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", m["device"]["name"]).strip("-").lower()
    stem = f"{m['commit'].replace('+', '-')}-{slug}" + ("-tiny" if report["tiny"] else "")
    targets = [kept / f"{stem}.md", kept / f"{stem}.json"]
    if any(t.exists() for t in targets):
        raise FileExistsError(
            f"a kept report {targets[0]} exists already; kept reports are never overwritten"
        )
    kept.mkdir(parents=True, exist_ok=True)
    for src, dst in zip((out / "report.md", out / "report.json"), targets, strict=True):
        shutil.copyfile(src, dst)
    return targets


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="repro gpu-report", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--tiny", action="store_true", help="every section at a tiny size (a check of the report)")
    p.add_argument("--out", default="results/gpu", help="output directory (default results/gpu)")
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}"
    )
    p.add_argument("--rounds", type=int, default=None, help="timed rounds of the steps (default 5; tiny 1)")
    p.add_argument(
        "--tests", default=None, help=f"pytest arguments of the tests section (default: {GPU_TESTS})"
    )
    p.add_argument(
        "--tests-timeout", type=float, default=240.0, help="seconds the tests may take (default 240)"
    )
    p.add_argument(
        "--compile", action="store_true", help="the steps compiled as well (each compiles: minutes)"
    )
    p.add_argument("--commit", default=None, help="the commit to name where this is no git checkout")
    p.add_argument("--keep", action="store_true", help="copy the report to results/reference/gpu/")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    asked = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in asked if s not in SECTIONS]
    if unknown or args.rounds is not None and args.rounds < 1:
        what = f"unknown section {unknown[0]!r}" if unknown else "--rounds takes at least 1"
        print(f"error: {what} (sections: {', '.join(SECTIONS)})", file=sys.stderr)
        return 2
    try:
        device = devices.resolve(args.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sizes = Sizes(args.tiny)
    rounds = args.rounds or (1 if args.tiny else 5)
    warmup = (
        (2 if args.tiny else 3) if args.compile else (1 if args.tiny else 2)
    )  # a compiled step compiles in warm-up
    out = Path(args.out)
    report: dict[str, Any] = {
        "machine": machine(device, args.commit),
        "command": "repro gpu-report " + " ".join(argv if argv is not None else sys.argv[1:]),
        "tiny": args.tiny,
        "asked": asked,
        "sections": {},
    }
    earlier = earlier_sections(out, report)
    if earlier:
        report["sections"].update(earlier)
        report["asked"] = [s for s in SECTIONS if s in asked or s in earlier]
        print(f"kept from the earlier run in {out} (same commit and device): {', '.join(earlier)}")
    print(f"gpu-report on {report['machine']['label']} ({report['machine']['timings']}) -> {out}/report.md")
    work = {
        "tests": lambda: run_tests(
            args.tests or (TINY_TESTS if args.tiny else GPU_TESTS), args.tests_timeout
        ),
        "steps": lambda: _steps(device, sizes, rounds, warmup, args.compile),
        "layers": lambda: time_layers(device, sizes.layers, sizes.layer_batch, reps=3 if args.tiny else 5),
        "profile": lambda: profile_steps(device, *sizes.profile),
    }
    try:
        for name in SECTIONS:
            if name not in asked:
                continue
            t0 = time.perf_counter()
            try:
                result = work[name]()
            except Exception as e:  # one section's failure must not cost the others
                result = {"failed": f"{type(e).__name__}: {e}"}
            result["seconds"] = time.perf_counter() - t0
            report["sections"][name] = result
            write(report, out)
            print(f"  {name}: {'failed' if 'failed' in result else 'done'} in {result['seconds']:.0f} s")
    except KeyboardInterrupt:
        write(report, out)
        print(f"interrupted: the finished sections are in {out}/report.md", file=sys.stderr)
        return 130
    if args.keep:
        for path in keep(report, out):
            print(f"kept {path}")
    return 0


def _steps(device, sizes: Sizes, rounds: int, warmup: int, compiled: bool) -> dict[str, Any]:
    models = []
    for model, batch, size in sizes.steps:
        try:
            models.append(time_steps(device, model, batch, size, rounds, warmup, compiled))
        except Exception as e:  # a diverged variant or an out-of-memory model: the other models still run
            models.append(
                {"model": model, "batch": batch, "size": size, "failed": f"{type(e).__name__}: {e}"}
            )
    timed = [m for m in models if "failed" not in m]
    return {"models": models, "targets": step_targets(timed) if device.type == "cuda" else []}


if __name__ == "__main__":
    sys.exit(main())
