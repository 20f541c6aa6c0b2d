"""The speed tables' generator: one side-by-side timing run per table (a cell), cached and resumable.

`generate_speed("table7", device="cuda")` times the ResNet-50 training step of every variant the table
needs, interleaved round by round (repro.steptime), and writes results/<name>.md, .csv and .meta.json.
The run is the cell: its key holds the device (GPU name, or CPU model and thread count), torch's
version, batch, size, rounds, and a hash of the project's kernel and framework sources, so a timing
of other code or another machine is never shown as this one. Samples are saved after every round
(results/cache/<key>.partial.json): a killed run resumes with the rounds it lacks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from atomic_files import write_file
from kernels.bench import devices
from repro import heap, steptime
from tables import provenance
from tables.cells import Cache
from tables.speed_spec import HALF, PeriodSpec, StepTimeSpec, variant_name, with_half_float_layers

TIMING_VERSION = 1
INT8_METHODS = ("daiq", "ui8", "gq")
# UI8 Table 2's two variants: a clip search in every iteration, and none after the first
SEARCH_EVERY_STEP = {"period": 1}
NEVER_SEARCH = {"period": 10**9}

STEP_CSV = [
    "precision", "method", "label", "paper_forward_ms", "paper_backward_ms", "paper_iteration_ms",
    "forward_ms", "backward_ms", "iteration_ms", "peak_memory_mb", "iteration_vs_fp16",
    "iteration_vs_fp32", "forward_vs_fp16", "backward_vs_fp16", "paper_iteration_vs_fp16",
    "paper_iteration_vs_fp32", "device", "batch", "size", "profile", "rounds", "source", "notes",
]  # fmt: skip
PERIOD_CSV = [
    "period", "paper_s_per_iter", "s_per_iter", "vs_period_1", "paper_vs_period_1", "device", "batch",
    "size", "profile", "rounds", "method", "source",
]  # fmt: skip


@dataclass(frozen=True)
class Setting:
    batch: int
    size: int
    rounds: int
    warmup: int


def setting(profile: str, device: torch.device, spec_kind: str) -> Setting:
    """Batch, resolution, rounds per profile. The paper's batch 64 at 224 px on a GPU; on the CPU the
    embedded default is batch 16 (a few minutes for a table); smoke is a tiny run for the tests."""
    if profile == "smoke":
        return Setting(batch=2, size=32, rounds=2, warmup=1)
    if device.type == "cuda" or profile == "paper":
        return Setting(batch=64, size=224, rounds=10 if device.type == "cuda" else 5, warmup=3)
    # embedded on the CPU; the clip search of every layer in every step (UI8 Table 2) is slow here
    return Setting(batch=16, size=224, rounds=6 if spec_kind == "step-time" else 4, warmup=2)


@functools.cache
def source_hash() -> str:
    """A hash of the sources whose speed is measured (kernels/, repro/): new code, new cells."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for package in ("kernels", "repro"):
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".cu", ".cuh", ".h", ".cpp", ".c"):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class TimingCell:
    """One side-by-side timing run; the unit of caching (duck-types tables.cells.Cell for the Cache)."""

    kind: str
    model: str
    variants_json: str
    device_json: str
    batch: int
    size: int
    rounds: int
    warmup: int
    profile: str
    sources: str
    malloc: str = "system"  # "reuse": the process kept freed memory for reuse (repro.heap)
    version: int = TIMING_VERSION

    def config(self) -> dict[str, Any]:
        cfg = dict(self.__dict__)
        cfg["variants"] = json.loads(cfg.pop("variants_json"))
        cfg["device"] = json.loads(cfg.pop("device_json"))
        return cfg

    @property
    def key(self) -> str:
        canonical = json.dumps(self.config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    @property
    def variants(self) -> list[steptime.Variant]:
        return [steptime.Variant(**v) for v in json.loads(self.variants_json)]


def step_variants(device: torch.device) -> list[steptime.Variant]:
    """The standard step-time run: every float variant of the device, the INT8 methods, and each INT8
    method again with its float layers under the half autocast (opt-in, with_half_float_layers)."""
    half = half_variant(device)
    amp = steptime.AMP_DTYPES[half]
    opt_in = [
        steptime.Variant(variant_name(with_half_float_layers(m), half), "INT8", method=m, amp=amp)
        for m in INT8_METHODS
    ]
    return steptime.float_variants(device) + [steptime.int8_variant(m) for m in INT8_METHODS] + opt_in


def period_variants() -> list[steptime.Variant]:
    return [
        steptime.Variant("search", "INT8", method="ui8", options=SEARCH_EVERY_STEP),
        steptime.Variant("plain", "INT8", method="ui8", options=NEVER_SEARCH),
    ]


def half_variant(device: torch.device) -> str:
    return "fp16" if device.type == "cuda" else "bf16"


def make_cell(
    spec, profile: str, device: torch.device, batch=None, size=None, rounds=None, compiled: bool = False
) -> TimingCell:
    """compiled: every variant also under torch.compile, timed in the same rounds (step-time tables)."""
    s = setting(profile, device, spec.kind)
    if compiled and spec.kind != "step-time":
        raise ValueError(f"{spec.name} times UI8's clip-search period; --compile applies to step-time tables")
    variants = step_variants(device) if spec.kind == "step-time" else period_variants()
    if compiled:
        variants += steptime.compiled_copies(variants)
    return TimingCell(
        kind=spec.kind,
        model=spec.model,
        variants_json=json.dumps([v.to_dict() for v in variants], sort_keys=True),
        device_json=json.dumps(devices.describe(device), sort_keys=True),
        batch=int(batch or s.batch),
        size=int(size or s.size),
        rounds=int(rounds or s.rounds),
        warmup=s.warmup,
        profile=profile,
        sources=source_hash(),
        malloc="reuse" if heap.applied() else "system",
    )


# ----------------------------------------------------------------------------------------------------
# running a cell, with its progress saved after every round


def _partial_path(cache: Cache, cell: TimingCell) -> Path:
    return cache.root / f"{cell.key}.partial.json"


def run_cell(cell: TimingCell, cache: Cache, device: torch.device, progress: bool = True, on_round=None):
    """The cell's result from the cache, or measured now (resuming a partial run); (result, cached)."""
    entry = cache.load(cell)
    if entry is not None:
        return entry["result"], True
    partial = _partial_path(cache, cell)
    done = None
    if partial.exists():
        try:
            saved = json.loads(partial.read_text())
            if saved.get("cell") == cell.config():
                done = saved["samples"]
        except (OSError, ValueError, KeyError):
            done = None
    have = 0 if not done else min(len(s["iteration"]) for s in done.values())
    variants = cell.variants
    todo_steps = (cell.warmup + max(0, cell.rounds - have)) * len(variants)
    bar = tqdm(total=todo_steps, desc=f"timing {cell.kind}", unit="step", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)  # fmt: skip
    if have:
        bar.write(f"resuming: {have} of {cell.rounds} rounds from {partial}")
    start = time.perf_counter()

    def save(rounds_done: int, samples: dict) -> None:
        cache.root.mkdir(parents=True, exist_ok=True)
        write_file(partial, json.dumps({"cell": cell.config(), "samples": samples}))
        if on_round:
            on_round(rounds_done, samples)

    try:
        out = steptime.time_variants(
            variants, model=cell.model, batch=cell.batch, size=cell.size, device=device,
            rounds=cell.rounds, warmup=cell.warmup, done=done, on_round=save, on_step=lambda: bar.update(1),
        )  # fmt: skip
    finally:
        bar.close()
    result = {"samples": out["samples"], "peak_memory_mb": out["peak_memory_mb"], "resumed_rounds": have}
    cache.store(cell, result, time.perf_counter() - start)
    partial.unlink(missing_ok=True)
    return result, False


# ----------------------------------------------------------------------------------------------------
# rendering


def _r(value, digits=1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.{digits}f}"


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _header(spec, cell: TimingCell, device: torch.device, what: str) -> list[str]:
    info = json.loads(cell.device_json)
    lines = [
        f"# {spec.paper} {spec.table}: {spec.title}, regenerated",
        "",
        f"Paper: {spec.citation}, {spec.table}; the paper's setting: {spec.paper_setting}.  ",
        f"Measured on: **{devices.label(info)}**; {spec.model} (torchvision, 1000 classes), batch "
        f"{cell.batch}, {cell.size}x{cell.size} input, one fixed random batch on the device, SGD with "
        f"momentum. Profile: {cell.profile}.  ",
        f"{what} Medians of {cell.rounds} rounds after {cell.warmup} warm-up rounds; the variants "
        "interleaved round by round, the device synchronised before every clock read.",
    ]
    if device.type == "cpu":
        notes = []
        if spec.kind == "step-time":
            notes.append(
                "On the CPU the FP16 row is **bf16 autocast** (what a CPU user runs: CPUs have no fast fp16)."
            )
        if (cell.batch, cell.size) != (64, 224):
            notes.append(
                "The paper's batch and resolution take long on a CPU: this run uses the batch and size above."
            )
        notes.append(
            "Freed tensor memory was kept for reuse between steps (repro.heap), for every row."
            if cell.malloc == "reuse"
            else "glibc's malloc defaults (REPRO_MALLOC=system): big tensors are mapped afresh every step."
        )
        lines += ["", " ".join(notes)] if notes else []
    lines += [
        "",
        "**The paper's times come from its own GPU and kernels: compare the ratios, not the milliseconds.**",
        "",
    ]
    return lines


COMPILED_NOTE = (
    "The same variant under torch.compile (compiled after one eager step; compile time not counted). Its "
    "iter / FP16 and iter / FP32 are against the compiled FP16 and FP32 rows."
)


def _measured(name, samples, peaks, cell, info, half, fp32) -> dict:
    """A row's measured columns: medians, peak memory, the setting, and ratios to the `half` and `fp32`
    variants within each round."""
    s = samples.get(name)
    med = steptime.medians_ms(s) if s else {}
    rec = {
        "forward_ms": med.get("forward"),
        "backward_ms": med.get("backward"),
        "iteration_ms": med.get("iteration"),
        "peak_memory_mb": peaks.get(name) if s else None,
        "device": devices.label(info),
        "batch": cell.batch,
        "size": cell.size,
        "profile": cell.profile,
        "rounds": cell.rounds,
    }
    for base, col in ((half, "fp16"), (fp32, "fp32")):
        b = samples.get(base)
        ok = s is not None and b is not None
        rec[f"iteration_vs_{col}"] = steptime.paired_ratio(s["iteration"], b["iteration"]) if ok else None
        if col == "fp16":
            rec["forward_vs_fp16"] = steptime.paired_ratio(s["forward"], b["forward"]) if ok else None
            rec["backward_vs_fp16"] = steptime.paired_ratio(s["backward"], b["backward"]) if ok else None
    return rec


def _label(row, info) -> str:
    on_half = row.variant == HALF or row.variant.endswith("+" + HALF)
    return row.label if not on_half or info["kind"] == "cuda" else f"{row.label} (bf16)"


def _compiled_records(spec, cell, samples, peaks, names, info, footnotes) -> list[dict]:
    """One row per timed variant of the spec under torch.compile, after the paper's rows."""
    suffix = steptime.COMPILED_SUFFIX
    if not any(v.compiled for v in cell.variants):
        return []
    half, fp32 = names.get(HALF, "fp16") + suffix, "fp32" + suffix
    mark = footnotes.setdefault(COMPILED_NOTE, len(footnotes) + 1)
    records = []
    for row in spec.rows:
        name = names[row.variant] + suffix
        if name not in samples:
            continue
        records.append(
            {
                "precision": row.precision,
                "method": name,
                "label": f"{_label(row, info)}, compiled",
                "paper_forward_ms": None,
                "paper_backward_ms": None,
                "paper_iteration_ms": None,
                **_measured(name, samples, peaks, cell, info, half, fp32),
                "source": "not in the paper",
                "paper_iteration_vs_fp16": None,
                "paper_iteration_vs_fp32": None,
                "notes": f"[{mark}] {COMPILED_NOTE}",
                "_marks": [mark],
            }
        )
    return records


def render_step(spec: StepTimeSpec, cell: TimingCell, result: dict, device: torch.device):
    samples, peaks = result["samples"], result["peak_memory_mb"]
    half = half_variant(device)
    names = {row.variant: variant_name(row.variant, half) for row in spec.rows}
    paper = {r.variant: r for r in spec.rows}
    paper_half = paper.get(HALF)
    paper_fp32 = paper.get("fp32")
    info = json.loads(cell.device_json)
    footnotes: dict[str, int] = {}
    records = []
    for row in spec.rows:
        name = names[row.variant]
        rec = {
            "precision": row.precision,
            "method": name,
            "label": _label(row, info),
            "paper_forward_ms": row.paper_forward_ms,
            "paper_backward_ms": row.paper_backward_ms,
            "paper_iteration_ms": row.paper_iteration_ms,
            **_measured(name, samples, peaks, cell, info, half, "fp32"),
            "source": str(row.source) if row.source else "not printed in the paper",
        }
        rec["paper_iteration_vs_fp16"] = _ratio(
            row.paper_iteration_ms, paper_half.paper_iteration_ms if paper_half else None
        )
        rec["paper_iteration_vs_fp32"] = _ratio(
            row.paper_iteration_ms, paper_fp32.paper_iteration_ms if paper_fp32 else None
        )
        notes = list(row.notes)
        if name not in samples:
            notes.append("Not timed on this device (CUDA only).")
        marks = [footnotes.setdefault(n, len(footnotes) + 1) for n in notes]
        rec["notes"] = " ".join(f"[{m}] {n}" for m, n in zip(marks, notes, strict=True))
        rec["_marks"] = marks
        records.append(rec)
    records += _compiled_records(spec, cell, samples, peaks, names, info, footnotes)
    frame = pd.DataFrame.from_records(records)
    marks = frame.pop("_marks").tolist()
    frame = frame[STEP_CSV]

    unit = " (printed in seconds, here in ms)" if spec.paper_unit == "s" else ""
    lines = _header(spec, cell, device, "forward = zero_grad + forward + loss; backward = loss.backward(); "
                    "iteration = forward + backward + optimizer step.")  # fmt: skip
    cols = ["Precision", "Method", f"Paper fwd ms{unit}", "Paper bwd ms", "Paper iter ms", "fwd ms", "bwd ms",
            "iter ms", "peak MB", "iter / FP16", "iter / FP32", "Paper iter / FP16",
            "Paper iter / FP32"]  # fmt: skip
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|---|---|" + "---:|" * (len(cols) - 2))
    for rec, mk in zip(frame.to_dict("records"), marks, strict=True):
        rec = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}
        cells = [
            rec["precision"],
            rec["label"] + "".join(f" [{m}]" for m in mk),
            _r(rec["paper_forward_ms"]),
            _r(rec["paper_backward_ms"]),
            _r(rec["paper_iteration_ms"]),
            _r(rec["forward_ms"]),
            _r(rec["backward_ms"]),
            _r(rec["iteration_ms"]),
            _r(rec["peak_memory_mb"], 0),
            _r(rec["iteration_vs_fp16"], 2),
            _r(rec["iteration_vs_fp32"], 2),
            _r(rec["paper_iteration_vs_fp16"], 2),
            _r(rec["paper_iteration_vs_fp32"], 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if footnotes:
        lines += ["", "Footnotes:", ""] + [f"[{i}] {t}  " for t, i in footnotes.items()]
    lines += [
        "",
        "Notes:",
        "",
        "- iter / FP16 and iter / FP32: the row's iteration time over the FP16 (FP32) row's, the median over "
        "rounds of the ratio within each round (below 1: faster). The paper's ratios come from its printed "
        "times.",
        "- peak MB: the most memory a training step needs above what is allocated before it (parameters, "
        "optimizer state, the batch): torch's CUDA allocator peak, or on the CPU the process's peak "
        "resident set (VmHWM, reset before the step).",
        "- FP16 = torch.autocast fp16 with a GradScaler, channels-last; FP32 on CUDA = NCHW without TF32 "
        "(as the paper's 2080 Ti); INT8 = repro.quantize_model on the same network (first and last layer "
        "float, the rest in fp32), channels-last.",
    ] + [f"- {n}" for n in spec.notes]
    return frame, "\n".join(lines) + "\n"


def render_period(spec: PeriodSpec, cell: TimingCell, result: dict, device: torch.device):
    samples = result["samples"]
    info = json.loads(cell.device_json)
    search, plain = samples["search"]["iteration"], samples["plain"]["iteration"]

    def per_iter(period: int) -> float:
        return statistics.median(p + (s - p) / period for s, p in zip(search, plain, strict=True))

    first = spec.rows[0]
    records = []
    for row in spec.rows:
        value = per_iter(row.period)
        records.append(
            {
                "period": row.period,
                "paper_s_per_iter": row.paper_s_per_iter,
                "s_per_iter": value,
                "vs_period_1": value / per_iter(first.period) if first.period == 1 else None,
                "paper_vs_period_1": row.paper_s_per_iter / first.paper_s_per_iter,
                "device": devices.label(info),
                "batch": cell.batch,
                "size": cell.size,
                "profile": cell.profile,
                "rounds": cell.rounds,
                "method": f"{spec.method} (t_plain + (t_search - t_plain) / period)",
                "source": str(row.source),
            }
        )
    frame = pd.DataFrame.from_records(records)[PERIOD_CSV]
    t_search, t_plain = statistics.median(search), statistics.median(plain)
    lines = _header(
        spec, cell, device,
        f"Two UI8 variants timed side by side: every layer searching its clip value in every iteration "
        f"(t_search = {t_search:.3f} s) and none searching (t_plain = {t_plain:.3f} s). A period P costs "
        "t_plain + (t_search - t_plain) / P per iteration (the search paid once per period), computed "
        "within each round.",
    )  # fmt: skip
    lines += [
        "| Period | Paper s/iter | s/iter | s/iter over period 1 | Paper over period 1 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for rec in records:
        lines.append(
            f"| {rec['period']} | {rec['paper_s_per_iter']:.3f} | {rec['s_per_iter']:.3f} | "
            f"{_r(rec['vs_period_1'], 2)} | {rec['paper_vs_period_1']:.2f} |"
        )
    lines += ["", "Notes:", ""] + [f"- {n}" for n in spec.notes]
    return frame, "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------
# the entry point


@dataclass
class SpeedGenerated:
    spec: Any
    cell: TimingCell
    frame: Any
    markdown: str
    meta: dict
    paths: dict
    cached: bool


def generate_speed(
    spec,
    *,
    profile: str = "embedded",
    device: str | torch.device | None = None,
    batch: int | None = None,
    size: int | None = None,
    rounds: int | None = None,
    results_dir="results",
    progress: bool = True,
    command: str | None = None,
    on_round=None,
    compiled: bool = False,
) -> SpeedGenerated:
    from tables.specs import get_spec

    if isinstance(spec, str):
        spec = get_spec(spec)
    dev = devices.resolve(device)
    for what, v in (("--batch", batch), ("--size", size), ("--rounds", rounds)):
        if v is not None and v < 1:
            raise ValueError(f"{what} must be at least 1, got {v}")
    results_dir = Path(results_dir)
    cache = Cache(results_dir / "cache")
    cell = make_cell(spec, profile, dev, batch, size, rounds, compiled)
    result, cached = run_cell(cell, cache, dev, progress=progress, on_round=on_round)
    render = render_step if spec.kind == "step-time" else render_period
    frame, md = render(spec, cell, result, dev)
    command = command or f"repro table {spec.name} --profile {profile} --device {dev.type}"
    md += f"\nGenerated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `{command}`" + (
        " from the cache" if cached else ""
    )
    md += f", at {provenance.line()}.\n"
    meta = {
        "name": spec.name,
        "paper": spec.paper,
        "table": spec.table,
        "title": spec.title,
        "kind": spec.kind,
        "profile": profile,
        "device": json.loads(cell.device_json),
        "device_label": devices.label(json.loads(cell.device_json)),
        "cell": cell.config(),
        "cell_key": cell.key,
        "cached": cached,
        "command": command,
        "csv_columns": list(frame.columns),
        "generated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **provenance.as_dict(),
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        k: results_dir / f"{spec.name}.{ext}"
        for k, ext in (("md", "md"), ("csv", "csv"), ("meta", "meta.json"))
    }
    write_file(paths["md"], md)
    write_file(paths["csv"], frame.to_csv(index=False))
    write_file(paths["meta"], json.dumps(meta, indent=1, default=str) + "\n")
    return SpeedGenerated(spec, cell, frame, md, meta, paths, cached)
