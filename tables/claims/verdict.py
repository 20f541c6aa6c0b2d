"""A claim, its verdict, and the rules that turn comparisons into a verdict (the same for every claim)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tables.claims.context import Context
    from tables.claims.intervals import Comparison

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
# a difference counts when it lies beyond the 95% interval (two-sided) of the noise: the seeds' spread
# and the test set's error, paired where the runs are kept (compare_rows), else Welch's t and binomial
LEVEL = 0.95


@dataclass
class Verdict:
    verdict: str
    measurement: str  # the numbers behind it, in one line
    reason: str = ""
    key: str = ""  # the one number (with its interval, where it has one) that says most: the report's summary


@dataclass(frozen=True)
class Claim:
    key: str
    paper: str  # "DAIQ", or "DAIQ / UI8" for a claim both papers make
    source: str  # table / figure / section, as the paper names it; naming the papers when there are two
    text: str
    check: Callable[[Context], Verdict]
    needs: tuple[str, ...] = ()  # the table and figure targets it reads


def cite(paper: str, source: str) -> str:
    """Where a claim is made: "UI8 Figure 2, Table 3", or the source alone where it names the papers
    ("DAIQ Table 7; UI8 Table 10")."""
    return source if source.startswith(tuple(paper.split(" / "))) else f"{paper} {source}"


SMALLER_THAN_PAPER = "smaller than the paper's"
MOST_SEEDS = 100  # seeds_to_settle's limit
ONE_RUN = "one run per curve: no estimate of the noise"


# where seeds_note also hands its counts, while tables.seed_plan records a claim's check
_RECORDING: contextvars.ContextVar[dict | None] = contextvars.ContextVar("seed_needs", default=None)


@contextlib.contextmanager
def recording_needs() -> Iterator[dict[str, int | None]]:
    """Collect every count seeds_note is given inside the block (tables.seed_plan)."""
    found: dict[str, int | None] = {}
    token = _RECORDING.set(found)
    try:
        yield found
    finally:
        _RECORDING.reset(token)


def seeds_note(needs: dict[str, int | None]) -> str:
    """What an inconclusive verdict would take: the seeds that would settle each unsettled comparison
    (`needs`, by name; only those whose spread is known), projected at the measured differences and
    spreads (tables.delta_interval.seeds_to_settle)."""
    if (recording := _RECORDING.get()) is not None:
        recording.update(needs)
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


def _key(name: str, c: Comparison) -> str:
    return f"{name} {c.text()}"


def seeded_verdict(
    comparisons: list[Comparison], names: list[str], measured: str, want: str, contrary: str
) -> Verdict:
    """The verdict from compare_rows()'s comparisons (`names` label them): reproduced when every one is
    `want` ('above' / 'below'), not reproduced (saying `contrary`) when one goes significantly the other
    way, or when one that is not significant excludes the paper's own difference (the replication
    criterion of the Open Science Collaboration, Science 2015: the original effect outside the
    replication's 95% interval), else inconclusive. Its key number is the comparison that decided it."""
    outcomes = [c.outcome for c in comparisons]
    sign = 1.0 if want == "above" else -1.0
    pairs = list(zip(names, comparisons, strict=True))
    if outcomes and all(o == want for o in outcomes):  # the key: the one nearest its edge
        name, c = min(pairs, key=lambda p: sign * (p[1].delta - p[1].margin) - p[1].half_width)
        return Verdict(REPRODUCED, measured, key=_key(name, c))
    against = "below" if want == "above" else "above"
    if against in outcomes:  # the key: the one furthest the other way
        name, c = min((p for p in pairs if p[1].outcome == against), key=lambda p: sign * p[1].delta)
        return Verdict(NOT_REPRODUCED, measured, contrary, _key(name, c))
    if "unknown" in outcomes:
        name, c = next(p for p in pairs if p[1].outcome == "unknown")
        return Verdict(INCONCLUSIVE, measured, "one seed: no estimate of the noise", _key(name, c))
    short = [(n, c) for n, c in pairs if c.outcome == "within" and c.short_of_paper(want)]
    if short:
        where = ", ".join(f"{n} (paper {c.paper:+.2f})" for n, c in short)
        reason = f"{SMALLER_THAN_PAPER}: the paper's difference lies outside the 95% interval for {where}"
        return Verdict(NOT_REPRODUCED, measured, reason + "; a smaller one is not ruled out", _key(*short[0]))
    needs = {n: c.seeds_to_settle() for n, c in pairs if c.outcome == "within" and c.spread is not None}
    # the key: the comparison that needs the most seeds (one beyond the limit counts as the most)
    hardest = max(needs, key=lambda n: MOST_SEEDS + 1 if needs[n] is None else needs[n]) if needs else None
    decided = next((p for p in pairs if p[0] == hardest), pairs[0] if pairs else None)
    reason = "differences within the seeds' spread" + seeds_note(needs)
    return Verdict(INCONCLUSIVE, measured, reason, _key(*decided) if decided else "")


def with_failed_cells(v: Verdict, failed: list[str]) -> Verdict:
    """A verdict read from tables some of whose cells failed is inconclusive: it would rest on fewer seeds
    or rows than the table has. The reason counts the failed cells and says what the finished ones read;
    the report lists each (`failed`: "<table>: <cell>: <why>", a Slurm job's id and its stderr's tail)."""
    n = len(failed)
    finished = v.verdict + (f": {v.reason}" if v.reason else "")
    reason = f"{n} failed cell{'' if n == 1 else 's'} in the tables it reads (listed in its details)"
    return Verdict(INCONCLUSIVE, v.measurement, f"{reason}; on the cells that finished, {finished}", v.key)


def direction(better: bool, measured: str, key: str = "") -> Verdict:
    """One run per curve: the direction of a difference, never a verdict on it."""
    word = "agrees" if better else "disagrees"
    return Verdict(INCONCLUSIVE, measured, f"{ONE_RUN} (the direction {word} with the paper)", key)
