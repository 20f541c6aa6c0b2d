"""What was reproduced: the papers' qualitative claims, each checked by a measurement made here.

    make claims [PROFILE=embedded]        # results/claims.md and results/claims.csv
    python -m tables.claims --profile smoke --results-dir results

Every claim names its source (paper, table or figure) and checks it with numbers this harness measures:
the tables it regenerates (cached cells, so a report after `make tables` costs nothing more), the speed
tables on the device at hand, the statistics recorder's figures. The verdict is computed from those
numbers, never typed: `reproduced`, `not reproduced`, or `inconclusive` with the reason (one seed and no
estimate of the noise, a difference within the seeds' spread, a stand-in that cannot show it). At the
smoke profile most verdicts are inconclusive, and say so; the embedded report is kept as
results/reference/embedded/claims.md. None of it is a paper-scale (ImageNet, COCO) result.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from scipy import stats

from atomic_files import write_file
from repro.steptime import COMPILED_SUFFIX
from tables import provenance
from tables.delta_interval import delta_interval, seeds_to_settle
from tasks.top1 import unpack_flags

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
# a difference counts when it lies beyond the 95% interval (two-sided) of the noise: the seeds' spread
# and the test set's error, paired where the runs are kept (compare_rows), else Welch's t and binomial
LEVEL = 0.95


@dataclass
class Verdict:
    verdict: str
    measurement: str  # the numbers behind it, in one line
    reason: str = ""


@dataclass(frozen=True)
class Claim:
    key: str
    paper: str
    source: str  # table / figure / section, as the paper names it
    text: str
    check: Callable[[Context], Verdict]
    needs: tuple[str, ...] = ()  # the table and figure targets it reads


class NotKept(LookupError):
    """A table the report reads is not among the kept results it was pointed at."""


@dataclass
class Context:
    """The measurements a report reads, generated on demand (cached) and remembered with their commands."""

    profile: str = "embedded"
    results_dir: Path = Path("results")
    seeds: int | None = None
    device: str | None = None
    progress: bool = True
    kept: Path | None = None  # read the tables from this directory's kept CSVs instead of generating them
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    metas: dict[str, dict] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)
    run_frames: dict[str, pd.DataFrame | None] = field(default_factory=dict)

    def table(self, name: str) -> pd.DataFrame:
        """The rendered table `name` (training or speed table) at this profile, generating missing cells."""
        if name not in self.frames and self.kept is not None:
            csv, meta = self.kept / f"{name}.csv", self.kept / f"{name}.meta.json"
            if not csv.exists():
                raise NotKept(f"{name} is not among the kept results in {self.kept} (`make {name}` runs it)")
            self.frames[name] = pd.read_csv(csv)
            self.metas[name] = json.loads(meta.read_text()) if meta.exists() else {}
            self.commands[name] = f"kept {csv}"
        if name not in self.frames:
            from tables.specs import SPEED_SPECS

            if name in SPEED_SPECS:
                from tables.speed import generate_speed

                out = generate_speed(name, profile=self.profile, device=self.device,
                                     results_dir=self.results_dir, progress=self.progress)  # fmt: skip
            else:
                from tables.generate import generate

                out = generate(name, profile=self.profile, seeds=self.seeds, results_dir=self.results_dir,
                               progress=self.progress)  # fmt: skip
            self.frames[name], self.metas[name] = out.frame, out.meta
            self.commands[name] = out.meta.get("command", f"repro table {name} --profile {self.profile}")
        return self.frames[name]

    def runs(self, name: str) -> pd.DataFrame | None:
        """The runs behind table `name`'s rows (tables.render.RUNS_COLUMNS), or None where none were kept
        (tables kept before 2026-11-27 have none)."""
        self.table(name)
        if name not in self.run_frames:
            found = self.metas.get(name, {}).get("row_runs")
            if found is None and self.kept is not None:
                path = self.kept / f"{name}.runs.csv.gz"
                found = pd.read_csv(path, dtype={"flags": str}) if path.exists() else None
            self.run_frames[name] = found
        return self.run_frames[name]

    def figure(self, name: str) -> pd.DataFrame:
        """The plotted data (CSV) of figure `name` at this profile, drawing it (and training its runs) if
        needed, or read from the kept results' figures/ directory."""
        if name not in self.frames:
            if self.kept is not None:
                csv = self.kept / "figures" / f"{name}.csv"
                if not csv.exists():
                    raise NotKept(f"{name} is not among the kept figures in {self.kept / 'figures'} "
                                  f"(`make {name}` draws it)")  # fmt: skip
                self.commands[name] = f"kept {csv}"
            else:
                from tables.figures.registry import make

                paths = make(name, self.profile, self.results_dir, progress=self.progress)
                csv = next(p for p in paths if p.suffix == ".csv")
                self.commands[name] = f"repro figure {name} --profile {self.profile}"
            self.frames[name] = pd.read_csv(csv)
        return self.frames[name]


# ----------------------------------------------------------------------------------------------------
# comparisons with the seeds' spread


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its standard deviation (None with one seed), the number of seeds, and the
    test set's standard error of the mean (points; None when the table does not carry it)."""

    mean: float | None
    std: float | None
    n: int
    test_se: float | None = None

    @property
    def se(self) -> float | None:
        return None if self.std is None or self.n < 2 else self.std / math.sqrt(self.n)

    def text(self) -> str:
        if self.mean is None:
            return "n/a"
        return f"{self.mean:.2f}" + (f" ± {self.std:.2f}" if self.std is not None else "") + f" (n={self.n})"


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def estimate(row: pd.Series, which: str = "int8") -> Estimate:
    test_se = _num(row.get(f"{which}_test_se"))
    return Estimate(_num(row[which]), _num(row[f"{which}_std"]), int(row[f"n_{which}"]), test_se)


def difference(a: Estimate, b: Estimate) -> tuple[float | None, float | None]:
    """a - b and the half-width of its 95% interval (None when either side has one seed): Welch's t on
    the seeds' spread, the test sets' errors added as known variances (unpaired: an upper bound)."""
    if a.mean is None or b.mean is None:
        return None, None
    if a.se is None or b.se is None:
        return a.mean - b.mean, None
    va, vb = a.se**2, b.se**2
    if va + vb == 0:
        t = float(stats.norm.ppf(0.5 + LEVEL / 2))
    else:
        dof = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
        t = float(stats.t.ppf(0.5 + LEVEL / 2, dof))
    tests = (a.test_se or 0.0) ** 2 + (b.test_se or 0.0) ** 2
    return a.mean - b.mean, math.sqrt(t**2 * (va + vb) + stats.norm.ppf(0.5 + LEVEL / 2) ** 2 * tests)


def _outcome(d: float | None, half: float | None, margin: float) -> str:
    if d is None or half is None:
        return "unknown"
    d -= margin
    if d > half:
        return "above"
    if d < -half:
        return "below"
    return "within"


def compare(a: Estimate, b: Estimate, margin: float = 0.0) -> str:
    """'above' if a exceeds b + margin beyond the 95% interval of the noise, 'below' if it falls short
    of b + margin beyond it, 'within' otherwise, 'unknown' without two seeds on both sides."""
    return _outcome(*difference(a, b), margin)


@dataclass(frozen=True)
class Comparison:
    """One row's INT8 against another's: compare()'s outcome, the difference and its 95% half-width."""

    outcome: str
    delta: float | None
    half_width: float | None
    paired: bool  # seed by seed and image by image; else Welch's t and unpaired test errors
    paper: float | None = None  # the same difference as the paper prints it, when it prints both rows
    margin: float = 0.0  # the edge the difference is compared with
    spread: float | None = None  # the per-seed differences' standard deviation (paired only)
    test_se: float | None = None  # the test set's paired standard error (paired only)
    seeds: int = 0  # the seeds both rows finished (paired only)

    def text(self) -> str:
        if self.delta is None:
            return "n/a"
        paper = "" if self.paper is None else f" (paper {self.paper:+.2f})"
        if self.half_width is None:
            return f"{self.delta:+.2f} (no interval){paper}"
        lo, hi = self.delta - self.half_width, self.delta + self.half_width
        return f"{self.delta:+.2f} [{lo:+.2f}, {hi:+.2f}]{paper}"

    def short_of_paper(self, want: str) -> bool:
        """The paper's difference goes the `want` way ('above' / 'below' zero) and lies beyond this 95%
        interval on its far side: whatever difference there is here is smaller than the paper's."""
        if self.paper is None or self.delta is None or self.half_width is None:
            return False
        sign = 1.0 if want == "above" else -1.0
        return sign * self.paper > 0 and sign * self.delta + self.half_width < sign * self.paper

    def seeds_to_settle(self) -> int | None:
        """The seeds that would take this interval off its edge at the measured difference and spread."""
        if self.delta is None:
            return None
        return seeds_to_settle(self.spread, self.test_se, self.seeds, abs(self.delta - self.margin))


PAIRED_NOTE = "paired seed by seed and image by image"
UNPAIRED_NOTE = "unpaired: the table's runs and their per-image flags are not kept"


def _paired_runs(runs: pd.DataFrame, row_a: int, row_b: int) -> tuple[list, list] | None:
    """The per-seed INT8 differences of two rows and their runs' per-image flags, over the seeds both
    finished; None when a run's flags are missing (then only the unpaired comparison is sound)."""

    def by_seed(row: int) -> dict[int, tuple[float, list[int] | None]]:
        got = runs[(runs["row"] == row) & (runs["precision"] == "int8") & runs["value"].notna()]
        return {int(r.seed): (float(r.value), unpack_flags(r.flags if isinstance(r.flags, str) else None))
                for r in got.itertuples()}  # fmt: skip

    a, b = by_seed(row_a), by_seed(row_b)
    seeds = sorted(a.keys() & b.keys())
    if not seeds or any(a[s][1] is None or b[s][1] is None for s in seeds):
        return None
    return [a[s][0] - b[s][0] for s in seeds], [(a[s][1], b[s][1]) for s in seeds]


def compare_rows(ctx: Context, name: str, a: pd.Series, b: pd.Series, margin: float = 0.0) -> Comparison:
    """Row a's INT8 against row b's, both of table `name`. The same seed trains both from the same start,
    and both are scored on the same images: where the table's runs are kept, the difference is taken
    seed by seed (Student's t on its spread) and its test-set error image by image (delta_interval),
    which removes the noise the two rows share; otherwise compare()'s unpaired bound."""
    runs = ctx.runs(name)
    paired = _paired_runs(runs, int(a.name), int(b.name)) if runs is not None else None
    spread = test_se = None
    seeds = 0
    if paired is None:
        d, half = difference(estimate(a), estimate(b))
    else:
        diffs, pairs = paired
        interval = delta_interval(diffs, pairs)
        d, half, test_se = statistics.fmean(diffs), interval.half_width, interval.test_se
        spread, seeds = (statistics.stdev(diffs) if len(diffs) > 1 else None), len(diffs)
    pa, pb = _num(a.get("paper_int8")), _num(b.get("paper_int8"))
    paper = None if pa is None or pb is None else pa - pb
    return Comparison(
        _outcome(d, half, margin), d, half, paired is not None, paper, margin, spread, test_se, seeds
    )


def _how_compared(comparisons: list[Comparison]) -> str:
    kinds = {c.paired for c in comparisons if c.delta is not None}
    return "; ".join(PAIRED_NOTE if k else UNPAIRED_NOTE for k in sorted(kinds, reverse=True))


SMALLER_THAN_PAPER = "smaller than the paper's"
MOST_SEEDS = 100  # seeds_to_settle's limit


def seeds_note(needs: dict[str, int | None]) -> str:
    """What an inconclusive verdict would take: the seeds that would settle each unsettled comparison
    (`needs`, by name; only those whose spread is known), projected at the measured differences and
    spreads (tables.delta_interval.seeds_to_settle)."""
    if not needs:
        return ""
    known = {k: n for k, n in needs.items() if n is not None}
    beyond = [k for k, n in needs.items() if n is None]
    head = "; at the measured differences and spreads"
    if not beyond:
        worst = max(known, key=known.get)
        most = f" ({worst} needs the most)" if len(known) > 1 else ""
        return f"{head}, {known[worst]} seeds would settle it{most}"
    named = ", ".join(beyond[:3]) + (f" and {len(beyond) - 3} more" if len(beyond) > 3 else "")
    rest = f" (the others up to {max(known.values())})" if known else ""
    return f"{head}, {named} would need more than {MOST_SEEDS} seeds{rest}"


def _seeded_verdict(
    comparisons: list[Comparison], names: list[str], measured: str, want: str, contrary: str
) -> Verdict:
    """The verdict from compare_rows()'s comparisons (`names` label them): reproduced when every one is
    `want` ('above' / 'below'), not reproduced (saying `contrary`) when one goes significantly the other
    way, or when one that is not significant excludes the paper's own difference (the replication
    criterion of the Open Science Collaboration, Science 2015: the original effect outside the
    replication's 95% interval), else inconclusive."""
    outcomes = [c.outcome for c in comparisons]
    if outcomes and all(o == want for o in outcomes):
        return Verdict(REPRODUCED, measured)
    if any(o == ("below" if want == "above" else "above") for o in outcomes):
        return Verdict(NOT_REPRODUCED, measured, contrary)
    if "unknown" in outcomes:
        return Verdict(INCONCLUSIVE, measured, "one seed: no estimate of the noise")
    short = [f"{n} (paper {c.paper:+.2f})" for n, c in zip(names, comparisons, strict=True)
             if c.outcome == "within" and c.short_of_paper(want)]  # fmt: skip
    if short:
        where = ", ".join(short)
        reason = f"{SMALLER_THAN_PAPER}: the paper's difference lies outside the 95% interval for {where}"
        return Verdict(NOT_REPRODUCED, measured, reason + "; a smaller one is not ruled out")
    needs = {n: c.seeds_to_settle() for n, c in zip(names, comparisons, strict=True)
             if c.outcome == "within" and c.spread is not None}  # fmt: skip
    return Verdict(INCONCLUSIVE, measured, "differences within the seeds' spread" + seeds_note(needs))


def row(frame: pd.DataFrame, **match) -> pd.Series:
    hit = frame
    for k, v in match.items():
        hit = hit[hit[k] == v]
    if len(hit) != 1:
        raise KeyError(f"{len(hit)} rows match {match}")
    return hit.iloc[0]


# ----------------------------------------------------------------------------------------------------
# the claims that rest on tables


def _clipping_fixes_the_crash(ctx: Context) -> Verdict:
    frame = ctx.table("ui8-table3")
    no_clip = row(frame, label="No clipping")
    clip = row(frame, label="Direction Sensitive Gradient Clipping")
    crashed = "diverged" in str(no_clip["status"])
    clip_ok = str(clip["status"]).startswith("ok")
    measured = (
        f"MobileNetV2 INT8 without clipping: {no_clip['status']} (top-1 {estimate(no_clip).text()}); with "
        f"clipping: {clip['status']} (top-1 {estimate(clip).text()}); {no_clip['dataset']}"
    )
    if crashed and clip_ok:
        return Verdict(REPRODUCED, measured)
    if not crashed and clip_ok:
        return Verdict(NOT_REPRODUCED, measured, "no crash without clipping at this scale and budget")
    return Verdict(INCONCLUSIVE, measured, "the clipped run diverged too")


def _period_costs_little(ctx: Context) -> Verdict:
    acc = ctx.table("ui8-table5")
    speed = ctx.table("ui8-table2")
    r1, r100 = row(acc, label="Period 1"), row(acc, label="Period 100")
    p1, p100 = estimate(r1), estimate(r100)
    t = dict(zip(speed["period"], speed["s_per_iter"], strict=True))
    saves = t[100] < 0.9 * t[1]
    c = compare_rows(ctx, "ui8-table5", r100, r1, margin=-1.0)  # 'below': period 100 loses more than 1
    drop = c.outcome
    measured = (
        f"top-1 period 1 {p1.text()}, period 100 {p100.text()}, difference {c.text()} ({_how_compared([c])}) "
        f"(UI8 Table 5, paper 93.66 -> 93.38); "
        f"s/iter period 1 {t[1]:.3f}, 100 {t[100]:.3f}, 1000 {t[1000]:.3f} (UI8 Table 2 on "
        f"{speed['device'].iloc[0]})"
    )
    if not saves:
        return Verdict(NOT_REPRODUCED, measured, "the longer period saves no time here")
    if drop == "below":
        return Verdict(NOT_REPRODUCED, measured, "period 100 loses more than one point")
    if drop == "unknown":
        return Verdict(INCONCLUSIVE, measured, "one seed: no estimate of the accuracy's noise")
    if drop == "within":  # not shown to lose less than a point either
        needs = {"period 100 - period 1": c.seeds_to_settle()} if c.spread is not None else {}
        reason = "the seeds' spread is wider than the point the claim allows" + seeds_note(needs)
        return Verdict(INCONCLUSIVE, measured, reason)
    return Verdict(REPRODUCED, measured)


def _daiq_ablations_beat_gq(ctx: Context) -> Verdict:
    frame = ctx.table("table2")
    gq_row = row(frame, method="gq")
    gq = estimate(gq_row)
    parts, diffs, comparisons = [f"GQ {gq.text()}"], [], []
    for method, name in (("daiq-gvq", "GVQ"), ("daiq-mcs", "MCS"), ("daiq", "GVQ+MCS")):
        r = row(frame, method=method)
        c = compare_rows(ctx, "table2", r, gq_row)
        comparisons.append(c)
        parts.append(f"{name} {estimate(r).text()}")
        diffs.append(f"{name} - GQ {c.text()}")
    stand_in = gq_row["dataset"]
    measured = (
        "top-1 " + ", ".join(parts) + "; " + ", ".join(diffs) + f" ({_how_compared(comparisons)}) "
        f"(DAIQ Table 2 stand-in: {stand_in})"
    )
    names = [f"{name} - GQ" for name in ("GVQ", "MCS", "GVQ+MCS")]
    return _seeded_verdict(comparisons, names, measured, "above", "a DAIQ variant is significantly below GQ")


def _flag_e2_worse_than_16_bit(ctx: Context) -> Verdict:
    frame = ctx.table("wageubn-table1")
    full8 = frame[frame["method"] == "wageubn"]
    e216 = frame[frame["method"] == "wageubn-e2-16"]
    comparisons, parts, names = [], [], []
    for _, r8 in full8.iterrows():
        r16 = e216[e216["model"] == r8["model"]]
        if r16.empty:
            continue
        c = compare_rows(ctx, "wageubn-table1", r16.iloc[0], r8)  # 16-bit E2 above full 8-bit?
        comparisons.append(c)
        names.append(str(r8["model"]))
        a, b = estimate(r8), estimate(r16.iloc[0])
        parts.append(f"{r8['model']}: full 8-bit {a.text()}, 16-bit E2 {b.text()}, difference {c.text()}")
    measured = "; ".join(parts) + f" ({_how_compared(comparisons)})"
    return _seeded_verdict(
        comparisons, names, measured, "above", "full 8-bit E2 is significantly better somewhere"
    )


def _e2_most_sensitive(ctx: Context) -> Verdict:
    frame = ctx.table("wageubn-table2")
    paths = {str(r["options"]).split("=")[-1]: r for _, r in frame.iterrows()}
    e2 = paths.pop("E2")
    order = sorted(paths.items(), key=lambda kv: m if (m := estimate(kv[1]).mean) is not None else math.inf)
    comparisons = {k: compare_rows(ctx, "wageubn-table2", e2, r) for k, r in order}
    measured = (
        f"top-1 with only E2 in 8 bits {estimate(e2).text()}; "
        + ", ".join(f"{k} {estimate(r).text()}" for k, r in order)
        + "; E2 minus each: "
        + ", ".join(f"{k} {c.text()}" for k, c in comparisons.items())
        + f" ({_how_compared(list(comparisons.values()))})"
    )
    contrary = "quantizing E2 alone costs significantly less than another path"
    names = [f"E2 - {k}" for k in comparisons]
    return _seeded_verdict(list(comparisons.values()), names, measured, "below", contrary)


# (speed table, its INT8 method, the paper's table) each speed claim reads; UI8 Table 10 has no FP16 row
INT8_SPEED_ROWS = {
    "FP32": (("table7", "daiq", "DAIQ Table 7"), ("ui8-table10", "ui8", "UI8 Table 10")),
    "FP16": (("table7", "daiq", "DAIQ Table 7"),),
}


def _int8_faster(baseline: str) -> Callable[[Context], Verdict]:
    column = "iteration_vs_fp16" if baseline == "FP16" else "iteration_vs_fp32"

    def check(ctx: Context) -> Verdict:
        parts, ratios, devices = [], [], {}
        for table, method, source in INT8_SPEED_ROWS[baseline]:
            frame = ctx.table(table)
            # eager, and compiled where the table timed it (`--compile`): each ratio is against the
            # baseline timed the same way, and the claim has to hold for both
            for name, how in ((method, ""), (method + COMPILED_SUFFIX, ", compiled")):
                if how and not (frame["method"] == name).any():
                    continue
                r = row(frame, method=name)
                ratio = float(r[column])
                ratios.append(ratio)
                paper = _num(r[f"paper_{column}"])
                what = f"ResNet-50 iteration, INT8 ({method.upper()}) over {baseline}"
                parts.append(
                    f"{source}{how}: {what}: {ratio:.2f}"
                    + (f" (paper {paper:.2f})" if paper is not None else "")
                    + f"; {r['iteration_ms']:.0f} ms at batch {r['batch']}, {r['size']} px"
                )
                devices.setdefault(str(r["device"]), None)
        measured = "; ".join(parts) + " on " + " and ".join(devices)
        table7 = ctx.table("table7")
        half = row(table7[~table7["method"].str.endswith(COMPILED_SUFFIX)], precision="FP16")
        if baseline == "FP16" and str(half["method"]) == "bf16" and max(ratios) < 0.2:
            slow = half["iteration_vs_fp32"]
            reason = (
                f"bf16 is emulated on this CPU ({slow:.1f}x FP32's time): it says nothing of a GPU's FP16"
            )
            return Verdict(INCONCLUSIVE, measured, reason)
        if max(ratios) < 0.95:
            return Verdict(REPRODUCED, measured)
        if max(ratios) > 1.05:
            return Verdict(NOT_REPRODUCED, measured, f"INT8 is slower than {baseline} on this device")
        return Verdict(INCONCLUSIVE, measured, "within 5%")

    return check


CLOSE_TO_FP32_TABLES = ("table3", "table4", "table6", "ui8-table6", "ui8-table7")


def within_a_point(delta: float | None, half_width: float | None, margin: float = 1.0) -> str:
    """'inside' when the 95% interval of INT8 - FP32 lies within +-margin, 'outside' when it lies wholly
    beyond it, 'straddles' when it crosses the edge, 'unknown' without an interval."""
    if delta is None or half_width is None:
        return "unknown"
    lo, hi = delta - half_width, delta + half_width
    if -margin <= lo and hi <= margin:
        return "inside"
    if hi < -margin or lo > margin:
        return "outside"
    return "straddles"


def _half_width(r: pd.Series) -> float | None:
    """The row's 95% half-width of INT8 - FP32; for tables kept before it was written, the seeds' share
    alone (Student's t on the per-seed differences' spread)."""
    half = _num(r.get("delta_ci95"))
    if half is not None:
        return half
    std, n = _num(r.get("delta_std")), int(min(r["n_int8"], r["n_fp32"]))
    if std is None or n < 2:
        return None
    return float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)


def mean_over_models(deltas: list[float]) -> tuple[float, float] | None:
    """(mean, 95% half-width) of the models' INT8 - FP32, each model one observation (Student's t over
    their spread: the seeds' and test set's noise and the models' own differences together); None for
    fewer than 3 models."""
    if len(deltas) < 3:
        return None
    half = float(stats.t.ppf(0.975, len(deltas) - 1)) * statistics.stdev(deltas) / math.sqrt(len(deltas))
    return statistics.fmean(deltas), half


def _means_over_models(name: str, by_method: dict[str, list[float]]) -> list[str]:
    out = []
    for method, deltas in by_method.items():
        if (m := mean_over_models(deltas)) is not None:
            mean, half = m
            ci = f"[{mean - half:+.2f}, {mean + half:+.2f}]"
            out.append(f"{name} {method} over {len(deltas)} models {mean:+.2f} {ci}")
    return out


def _close_to_fp32(ctx: Context) -> Verdict:
    parts, outcomes, seen, needs, means = [], [], set(), {}, []
    for name in CLOSE_TO_FP32_TABLES:
        frame = ctx.table(name)
        ours = frame["status"].astype(str).str.startswith("ok") & frame["method"].isin(["daiq", "ui8"])
        # the claim is about 8-bit weights ("bits" is read as floats when every row is empty)
        ours &= ~frame["bits"].map(lambda b: isinstance(b, str) and b.startswith("2/")).astype(bool)
        several_datasets = frame[ours]["dataset"].nunique() > 1
        rows, by_method = [], {}
        for _, r in frame[ours].iterrows():
            cell = (r["model"], r["method"], str(r["options"]), r["dataset"], str(r["int8"]), str(r["fp32"]))
            if cell in seen:  # DAIQ Table 3 and UI8 Table 6 share their UI8 cells: count each once
                continue
            seen.add(cell)
            delta, half = _num(r["delta"]), _half_width(r)
            o = within_a_point(delta, half)
            if o == "outside":  # which way matters to the reader: a loss, or FP32 trailing INT8
                o = "outside-below" if delta < 0 else "outside-above"
            outcomes.append(o)
            if delta is not None:  # method, not label: "Ours" is DAIQ or UI8 by paper
                where = f" ({r['dataset']})" if several_datasets else ""
                spread = _num(r.get("delta_std"))
                if o == "straddles" and spread is not None:
                    seeds = int(min(r["n_int8"], r["n_fp32"]))
                    settle = seeds_to_settle(
                        spread, _num(r.get("delta_test_se")), seeds, abs(abs(delta) - 1.0)
                    )
                    needs[f"{name} {r['model']} {r['method']}{where}"] = settle
                ci = f" [{delta - half:+.2f}, {delta + half:+.2f}]" if half is not None else " (no interval)"
                rows.append(f"{r['model']} {r['method']}{where} {delta:+.2f}{ci}")
                if not several_datasets:  # a mean over models of one dataset
                    by_method.setdefault(r["method"], []).append(delta)
        if rows:
            parts.append(f"{name}: " + ", ".join(rows))
        means += _means_over_models(name, by_method)
    measured = "INT8 - FP32 top-1 and its 95% interval: " + "; ".join(parts)
    if means:  # what the rows say together: not the claim (every model within a point), its average
        measured += ". Mean over a table's models and its 95% interval (each model one observation): "
        measured += "; ".join(means)
    if not outcomes:
        return Verdict(INCONCLUSIVE, measured, "no row finished")
    lost, gained = outcomes.count("outside-below"), outcomes.count("outside-above")
    if lost or gained:
        said = [f"{lost} lose more than a point"] if lost else []
        if gained:
            said.append(f"{gained} score more than a point above FP32 (a weak FP32 baseline at this scale)")
        return Verdict(NOT_REPRODUCED, measured, f"of {len(outcomes)} rows, " + " and ".join(said))
    if "unknown" in outcomes:
        n = outcomes.count("unknown")
        return Verdict(INCONCLUSIVE, measured, f"{n} of {len(outcomes)} rows have one seed: no interval")
    if "straddles" in outcomes:
        n = outcomes.count("straddles")
        reason = f"{n} of {len(outcomes)} rows' intervals cross one point" + seeds_note(needs)
        return Verdict(INCONCLUSIVE, measured, reason)
    return Verdict(REPRODUCED, measured)


# ----------------------------------------------------------------------------------------------------
# the claims that rest on the statistics recorder's figures (one recorded run per curve: a difference
# between single runs is only a direction, unless the claim is about an effect as large as a failure)

ONE_RUN = "one run per curve: no estimate of the noise"


def _direction(better: bool, measured: str) -> Verdict:
    word = "agrees" if better else "disagrees"
    return Verdict(INCONCLUSIVE, measured, f"{ONE_RUN} (the direction {word} with the paper)")


def _final_top1(frame: pd.DataFrame, by: str = "run") -> dict[str, float]:
    done = frame.dropna(subset=["val_top1"])
    return {str(k): float(v) for k, v in done.groupby(by)["val_top1"].last().items()}


def _ks_gradients_fail(ctx: Context) -> Verdict:
    frame = ctx.figure("ui8-table1")
    dists = ("gaussian", "laplace", "student")
    parts, g_all_rejected, w_some_accepted = [], True, True
    for r in frame.to_dict("records"):
        rejected = [d for d in dists if r[d] > r["critical"]]
        parts.append(f"{r['layer']} {r['data']}: " + ", ".join(f"{d} {r[d]:.3f}" for d in dists)
                     + f" (critical {r['critical']:.4f})")  # fmt: skip
        if r["data"] == "g":
            g_all_rejected &= len(rejected) == len(dists)
        else:
            w_some_accepted &= len(rejected) < len(dists)
    measured = "KS D_n, median over recorded iterations: " + "; ".join(parts)
    if g_all_rejected and w_some_accepted:
        return Verdict(REPRODUCED, measured)
    why = []
    if not g_all_rejected:
        why.append("a gradient is not rejected by every fit")
    if not w_some_accepted:
        why.append("a weight is rejected by every fit")
    return Verdict(NOT_REPRODUCED, measured, "; ".join(why))


def _histogram_std(group: pd.DataFrame) -> float:
    w = group["count"].to_numpy(dtype=float)
    x = group["bin_centre"].to_numpy(dtype=float)
    if w.sum() <= 0:
        return math.nan
    mean = (w * x).sum() / w.sum()
    return math.sqrt((w * (x - mean) ** 2).sum() / w.sum())


def _gradient_distributions_change(ctx: Context) -> Verdict:
    frame = ctx.figure("ui8-figure3")
    panels = {"(b)": "over iterations", "(c)": "with depth", "(d)": "with layer structure"}
    parts, changes = [], []
    for panel, what in panels.items():
        stds = [_histogram_std(g) for _, g in frame[frame["panel"] == panel].groupby("series")]
        stds = [v for v in stds if v > 0]
        ratio = max(stds) / min(stds) if len(stds) > 1 else math.nan
        changes.append(ratio >= 2.0)
        parts.append(f"{what}: std of g spans {ratio:.1f}x over {len(stds)} histograms")
    measured = "MobileNetV2 gradients (UI8 Fig. 3 panels b-d): " + "; ".join(parts)
    if all(changes):
        return Verdict(REPRODUCED, measured)
    return Verdict(NOT_REPRODUCED, measured, "a spread changes by less than 2x")


def _crashed(top1: float) -> bool:
    """A run that ended near chance (10 classes) or not at all: the papers' "crash"."""
    return math.isnan(top1) or top1 < 20.0


def _lower_lr_delays_the_crash(ctx: Context) -> Verdict:
    frame = ctx.figure("ui8-figure4")
    top1 = _final_top1(frame[frame["panel"] == "b"])
    measured = "final top-1 without clipping: " + ", ".join(f"{k} {v:.1f}" for k, v in top1.items())
    crashed = [k for k, v in top1.items() if "no scaling" in k and _crashed(v)]
    if not crashed:
        return Verdict(
            INCONCLUSIVE, measured, "no run without clipping crashed at this scale: no crash to delay"
        )
    return Verdict(INCONCLUSIVE, measured, f"crashed: {', '.join(crashed)}; {ONE_RUN}")


def _phi_scaling_beats_fixed_rates(ctx: Context) -> Verdict:
    frame = ctx.figure("ui8-figure4")
    paired = frame[frame["panel"] == "b-paired"] if "panel" in frame else frame.iloc[:0]
    if len(paired) and (paired["seeds"] >= 2).all():
        return _phi_against_each_rate(frame[frame["panel"] == "b-final"], paired)
    top1 = _final_top1(frame.query("panel == 'b'"))
    phi = {k: v for k, v in top1.items() if "with phi" in k}
    fixed = {k: v for k, v in top1.items() if "no scaling" in k}
    if not phi or not fixed:
        return Verdict(INCONCLUSIVE, "", "the figure has no phi-scaled or no fixed-rate run")
    measured = "final top-1: " + ", ".join(f"{k} {v:.1f}" for k, v in top1.items())
    return _direction(min(phi.values()) > max(fixed.values()), measured)


def _phi_against_each_rate(finals: pd.DataFrame, paired: pd.DataFrame) -> Verdict:
    """The seeded reading of UI8 Figure 4b: eta1 (phi scaling) minus each fixed rate, paired seed by seed
    and image by image (the figure's "b-paired" rows, tables.delta_interval)."""
    tops = finals.dropna(subset=["val_top1"]).groupby("run")["val_top1"]
    measured = "final top-1 over seeds: " + ", ".join(
        f"{run} {Estimate(g.mean(), g.std() if len(g) > 1 else None, len(g)).text()}" for run, g in tops
    )
    parts, below, needs, missing = [], [], {}, []
    for r in paired.to_dict("records"):
        delta, half = float(r["delta"]), float(r["half_width"])
        if math.isnan(delta) or math.isnan(half):  # a setting whose runs all diverged: nothing to compare
            parts.append(f"{r['run']} n/a")
            missing.append(r["run"])
            continue
        parts.append(f"{r['run']} {delta:+.2f} [{delta - half:+.2f}, {delta + half:+.2f}]")
        if delta + half < 0:
            below.append(r["run"])
        elif delta - half <= 0:
            needs[r["run"]] = seeds_to_settle(
                _num(r["spread"]), _num(r["test_se"]), int(r["seeds"]), abs(delta)
            )
    measured += "; eta1 minus each (paired seed by seed and image by image): " + ", ".join(parts)
    if below:
        return Verdict(
            NOT_REPRODUCED, measured, f"phi(d_c) scaling is significantly below {', '.join(below)}"
        )
    if missing:
        return Verdict(INCONCLUSIVE, measured, f"no interval for {', '.join(missing)} (its runs diverged)")
    if needs:
        return Verdict(INCONCLUSIVE, measured, "differences within the seeds' spread" + seeds_note(needs))
    return Verdict(REPRODUCED, measured)


def _weaker_forms_crash(ctx: Context) -> Verdict:
    # UI8 sec. 4.1 on Figure 6(b): the linear and quadratic forms "are too weak to control optimization
    # direction ... and model crashes"; the exponential one prevents it. A crash shows in one run.
    top1 = _final_top1(ctx.figure("ui8-figure6"))
    exp = [v for k, v in top1.items() if k.startswith("exponential")]
    others = {k: v for k, v in top1.items() if not k.startswith("exponential")}
    if not exp or not others:
        return Verdict(INCONCLUSIVE, "", "the figure lacks a scaling form")
    measured = "final top-1: " + ", ".join(f"{k} {v:.1f}" for k, v in top1.items())
    if _crashed(exp[0]):
        return Verdict(NOT_REPRODUCED, measured, "the exponential form crashed too")
    crashed = [k for k, v in others.items() if _crashed(v)]
    if len(crashed) == len(others):
        return Verdict(REPRODUCED, measured)
    if not crashed:
        return Verdict(INCONCLUSIVE, measured, "no form crashed at this scale: no crash to prevent")
    trained = ", ".join(k for k in others if k not in crashed)
    return Verdict(NOT_REPRODUCED, measured, f"{trained} trained where the paper's crashed")


def _gvq_lower_error(ctx: Context) -> Verdict:
    frame = ctx.figure("daiq-figure3")
    e = frame[frame["panel"] == "a"].pivot_table(index="iteration", columns="run", values="E")
    share = float((e["OursGVQ"] < e["GQ"]).mean())
    measured = (f"E (alpha 0.2) mean GQ {e['GQ'].mean():.3g}, GVQ {e['OursGVQ'].mean():.3g}; GVQ lower at "
                f"{share:.0%} of {len(e)} recorded iterations")  # fmt: skip
    if share >= 0.9:
        return Verdict(REPRODUCED, measured)
    if share <= 0.5:
        return Verdict(NOT_REPRODUCED, measured, "GVQ's error is not lower most of the time")
    return Verdict(INCONCLUSIVE, measured, "GVQ lower only part of the time")


def _inverted_t_fits_at_times(ctx: Context) -> Verdict:
    frame = ctx.figure("daiq-figure3")
    d = frame[frame["panel"] == "b"].pivot_table(index="iteration", columns="fit", values="D_n")
    share = float((d["Inverted-T"] < d["Gaussian"]).mean())
    measured = (f"D_n mean Inverted-T {d['Inverted-T'].mean():.3f}, Gaussian {d['Gaussian'].mean():.3f}; "
                f"Inverted-T closer at {share:.0%} of {len(d)} recorded iterations")  # fmt: skip
    if share > 0:
        return Verdict(REPRODUCED, measured)
    return Verdict(NOT_REPRODUCED, measured, "the Gaussian fits better at every recorded iteration")


def _flag_keeps_nonzeros(ctx: Context) -> Verdict:
    ratios = ctx.figure("wageubn-figure10").groupby("quantizer")["data_ratio_mean"].mean()
    zeros = ctx.figure("wageubn-figure9").dropna(subset=["zeros"]).groupby("panel")["zeros"].last()
    plain, flag = ratios.get("8-bit QE2"), ratios.get("8-bit Flag QE2")
    measured = (
        f"share of e_l3 values kept nonzero, mean over ResNet-18 layers: Flag QE2 {flag:.2f}, "
        f"plain 8-bit QE2 {plain:.2f}; zeros: " + ", ".join(f"{k} {v:.2f}" for k, v in zeros.items())
    )
    if flag > plain:
        return Verdict(REPRODUCED, measured)
    return Verdict(NOT_REPRODUCED, measured, "plain 8-bit QE2 keeps as many values")


def _plain_qe2_fails(ctx: Context) -> Verdict:
    top1 = _final_top1(ctx.figure("wageubn-figure9"))
    plain = next((v for k, v in top1.items() if "shift8" in k), None)
    flag = next((v for k, v in top1.items() if "Flag" in k), None)
    if plain is None or flag is None:
        return Verdict(INCONCLUSIVE, "", "the figure lacks the plain or the Flag QE2 run")
    measured = "final top-1: " + ", ".join(f"{k} {v:.1f}" for k, v in top1.items())
    if math.isnan(plain) or plain < flag - 10.0:  # a failure, not a difference within a run's noise
        return Verdict(REPRODUCED, measured)
    return Verdict(NOT_REPRODUCED, measured, "plain 8-bit QE2 trains at this scale")


CLAIMS: tuple[Claim, ...] = (
    Claim("ui8-clipping", "UI8", "Figure 2, Table 3",
          "MobileNetV2 INT8 training without gradient clipping crashes; direction-sensitive clipping "
          "fixes it",
          _clipping_fixes_the_crash, ("ui8-table3",)),
    Claim("ui8-period", "UI8", "Tables 2 and 5",
          "A longer clip-update period costs little accuracy and saves time",
          _period_costs_little, ("ui8-table5", "ui8-table2")),
    Claim("daiq-ablation", "DAIQ", "Table 2",
          "GVQ, MCS and both together each beat per-tensor GQ", _daiq_ablations_beat_gq, ("table2",)),
    Claim("wageubn-e2", "WAGEUBN", "Table I",
          "The full 8-bit version (Flag QE2) is worse than the 16-bit E2 version",
          _flag_e2_worse_than_16_bit, ("wageubn-table1",)),
    Claim("wageubn-sensitivity", "WAGEUBN", "Table II",
          "E2 is the most sensitive data path: quantizing it alone costs the most accuracy",
          _e2_most_sensitive, ("wageubn-table2",)),
    Claim("int8-vs-fp32", "DAIQ / UI8", "DAIQ Table 7, UI8 Table 10",
          "INT8 training is faster per iteration than FP32", _int8_faster("FP32"), ("table7", "ui8-table10")),
    Claim("int8-vs-fp16", "DAIQ", "Table 7",
          "INT8 training is faster per iteration than FP16", _int8_faster("FP16"), ("table7",)),
    Claim("close-to-fp32", "DAIQ / UI8", "DAIQ Tables 3, 4 and 6, UI8 Tables 6 and 7",
          "DAIQ and UI8 stay within about one point of FP32 across models", _close_to_fp32,
          CLOSE_TO_FP32_TABLES),
    Claim("ui8-ks", "UI8", "Table 1",
          "Gradients fail the KS tests against Gaussian, Laplace and Student-t fits; weights mostly pass",
          _ks_gradients_fail, ("ui8-table1",)),
    Claim("ui8-distributions", "UI8", "Figure 3, C1-C4",
          "Gradient distributions change over training, with depth and with layer structure",
          _gradient_distributions_change, ("ui8-figure3",)),
    Claim("ui8-lower-lr", "UI8", "Section 3.3, Figure 4b",
          "A lower learning rate delays the crash of INT8 training without clipping",
          _lower_lr_delays_the_crash, ("ui8-figure4",)),
    Claim("ui8-phi", "UI8", "Figure 4b",
          "Deviation-counteractive learning-rate scaling beats fixed learning rates",
          _phi_scaling_beats_fixed_rates, ("ui8-figure4",)),
    Claim("ui8-exponential", "UI8", "Figure 6b",
          "Without clipping, the linear and quadratic scaling forms crash where the exponential one trains",
          _weaker_forms_crash, ("ui8-figure6",)),
    Claim("daiq-gvq-error", "DAIQ", "Figure 3a",
          "GVQ has lower quantization error E than per-tensor GQ", _gvq_lower_error, ("daiq-figure3",)),
    Claim("daiq-inverted-t", "DAIQ", "Figure 3b",
          "The Inverted-T distribution fits the gradients better than a Gaussian at times",
          _inverted_t_fits_at_times, ("daiq-figure3",)),
    Claim("wageubn-flag-nonzeros", "WAGEUBN", "Figures 9 and 10",
          "Flag QE2 keeps more of the error's values than plain 8-bit QE2", _flag_keeps_nonzeros,
          ("wageubn-figure9", "wageubn-figure10")),
    Claim("wageubn-plain-qe2", "WAGEUBN", "Figure 9",
          "Plain 8-bit QE2 fails where Flag QE2 trains", _plain_qe2_fails, ("wageubn-figure9",)),
)  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# the report

CSV_COLUMNS = ["key", "paper", "source", "claim", "verdict", "measurement", "reason", "commands", "profile"]


def evaluate(ctx: Context, claims=CLAIMS) -> pd.DataFrame:
    records = []
    for claim in claims:
        try:
            v = claim.check(ctx)
        except NotKept as err:
            v = Verdict(INCONCLUSIVE, "", f"not measured: {err}")
        except Exception as err:  # noqa: BLE001 - one claim's failure is reported, the rest still run
            v = Verdict(INCONCLUSIVE, "", f"could not be measured: {type(err).__name__}: {err}")
        commands = "; ".join(ctx.commands[n] for n in claim.needs if n in ctx.commands)
        records.append(
            {"key": claim.key, "paper": claim.paper, "source": claim.source, "claim": claim.text,
             "verdict": v.verdict, "measurement": v.measurement, "reason": v.reason, "commands": commands,
             "profile": ctx.profile}
        )  # fmt: skip
    return pd.DataFrame.from_records(records, columns=CSV_COLUMNS)


def markdown(frame: pd.DataFrame, ctx: Context) -> str:
    counts = frame["verdict"].value_counts()
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE))
    data = sorted({str(m.get("dataset_used", "")) for m in ctx.metas.values() if m.get("dataset_used")})
    devices = sorted({str(m.get("device_label", "")) for m in ctx.metas.values() if m.get("device_label")})
    lines = [
        "# What was reproduced: the papers' claims checked here",
        "",
        f"Profile: {ctx.profile}. {summary}. Data: {'; '.join(data) or '-'}. Speed measured on: "
        f"{'; '.join(devices) or '-'}.  ",
        *(
            [f"Read from the tables kept in `{ctx.kept}` (nothing trained for this report).  "]
            if ctx.kept
            else []
        ),
        "Each verdict is computed from the measurement beside it (tables.claims): a difference counts when "
        f"it lies beyond the {LEVEL:.0%} interval of the noise (the seeds' spread with Student's t, and the "
        "test set's error). An INT8 - FP32 difference, and one row's INT8 against another's where the "
        "table's runs are kept (`<table>.runs.csv.gz`), is paired seed by seed and image by image "
        "(tables/delta_interval.py); without the runs, Welch's t and the two test sets' binomial errors "
        "added (an upper bound). With one seed there is no spread and the verdict is inconclusive. "
        "A difference the paper claims that is not significant here counts as not reproduced when the "
        "paper's own difference lies outside its 95% interval (smaller here than the paper's; the Open "
        "Science Collaboration's replication criterion, Science 2015), else as inconclusive.",
        "",
        f"**Measured at the {ctx.profile} profile on stand-in data and short schedules: these are not "
        "reproductions of the papers' ImageNet, CIFAR-10, COCO or Kinetics numbers.**",
        "",
        "| Claim | Source | Verdict | Measurement | Reason |",
        "|---|---|---|---|---|",
    ]
    for r in frame.to_dict("records"):
        cells = [
            r["claim"],
            f"{r['paper']} {r['source']}",
            f"**{r['verdict']}**",
            r["measurement"],
            r["reason"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    lines += ["", "Commands:", ""] + [f"- `{c}`" for c in dict.fromkeys(ctx.commands.values())]
    lines += [
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `make claims PROFILE={ctx.profile}"
        + (f" KEPT={ctx.kept}" if ctx.kept else "")
        + (f" RESULTS={ctx.results_dir}`" if ctx.results_dir != Path("results") else "`")
        + f", at {provenance.line()}.",
    ]
    return "\n".join(lines) + "\n"


def write(ctx: Context, claims=CLAIMS) -> tuple[pd.DataFrame, dict[str, Path]]:
    frame = evaluate(ctx, claims)
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": ctx.results_dir / "claims.md", "csv": ctx.results_dir / "claims.csv"}
    write_file(paths["md"], markdown(frame, ctx))
    write_file(paths["csv"], frame.to_csv(index=False))
    return frame, paths


def main(argv=None) -> int:
    from tasks import PROFILES

    ap = argparse.ArgumentParser(prog="python -m tables.claims", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--results-dir", default="results", type=Path)
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--device", default=None, help="the speed tables' device (default: cuda when present)")
    ap.add_argument("--no-progress", action="store_true")
    kept_help = "read the tables kept in this directory (e.g. results/reference/embedded), generate none"
    ap.add_argument("--kept", type=Path, default=None, help=kept_help)
    args = ap.parse_args(argv)
    if args.profile not in PROFILES:
        print(f"error: unknown profile {args.profile!r}; choose from {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    if args.kept is not None and not args.kept.is_dir():
        print(f"error: --kept {args.kept}: no such directory", file=sys.stderr)
        return 2
    ctx = Context(args.profile, args.results_dir, args.seeds, args.device, not args.no_progress, args.kept)
    frame, paths = write(ctx)
    print(paths["md"].read_text())
    print(f"wrote {paths['md']} and {paths['csv']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
