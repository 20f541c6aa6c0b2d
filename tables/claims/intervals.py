"""The claims' statistics: a mean over seeds, a difference and its 95% interval (paired seed by seed and
image by image where a table's runs are kept, else Welch's t with the test sets' errors), an interval
against a one-point edge, and a mean over a table's models."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
from scipy import stats

from tables.claims.verdict import LEVEL
from tables.delta_interval import delta_interval, seeds_to_settle
from tasks.top1 import unpack_flags

if TYPE_CHECKING:
    from tables.claims.context import Context


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


def num(v) -> float | None:
    """A table cell as a float, None where it is empty (NaN)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def estimate(row: pd.Series, which: str = "int8") -> Estimate:
    test_se = num(row.get(f"{which}_test_se"))
    return Estimate(num(row[which]), num(row[f"{which}_std"]), int(row[f"n_{which}"]), test_se)


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
    pa, pb = num(a.get("paper_int8")), num(b.get("paper_int8"))
    paper = None if pa is None or pb is None else pa - pb
    return Comparison(
        _outcome(d, half, margin), d, half, paired is not None, paper, margin, spread, test_se, seeds
    )


def how_compared(comparisons: list[Comparison]) -> str:
    kinds = {c.paired for c in comparisons if c.delta is not None}
    return "; ".join(PAIRED_NOTE if k else UNPAIRED_NOTE for k in sorted(kinds, reverse=True))


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


def half_width(r: pd.Series) -> float | None:
    """The row's 95% half-width of INT8 - FP32; for tables kept before it was written, the seeds' share
    alone (Student's t on the per-seed differences' spread)."""
    half = num(r.get("delta_ci95"))
    if half is not None:
        return half
    std, n = num(r.get("delta_std")), int(min(r["n_int8"], r["n_fp32"]))
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
