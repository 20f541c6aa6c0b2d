"""The claims report as Markdown: a header (profile, data, device, how a verdict is reached), one compact
table (claim, verdict, its key number, a short reason), then each claim's details: the whole measurement,
the whole reason, and the commands that make what it reads."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from tables import provenance
from tables.claims.context import Context
from tables.claims.verdict import INCONCLUSIVE, LEVEL, NOT_REPRODUCED, REPRODUCED, cite

VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)


def summary(frame: pd.DataFrame) -> str:
    """The verdicts counted: "5 reproduced, 6 not reproduced, 6 inconclusive"."""
    counts = frame["verdict"].value_counts()
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)


def split_top_level(text: str, seps: tuple[str, ...] = ("; ", ". ")) -> list[str]:
    """`text` cut at each separator that stands outside brackets: a measurement's parts, one a line."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        depth += (ch in "([") - (ch in ")]")
        sep = next((s for s in seps if depth == 0 and text.startswith(s, i)), None)
        if sep is None:
            i += 1
            continue
        parts.append(text[start:i] + ("" if sep == "; " else "."))
        start = i = i + len(sep)
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def short_reason(reason: str) -> str:
    """The reason's first clause: the rest (how many seeds would settle it, ...) is in the details."""
    return split_top_level(str(reason), ("; ",))[0] if str(reason).strip() else ""


def cell(text) -> str:
    return "" if pd.isna(text) else str(text).replace("|", "\\|")


def _header(frame: pd.DataFrame, ctx: Context) -> list[str]:
    data = sorted({str(m.get("dataset_used", "")) for m in ctx.metas.values() if m.get("dataset_used")})
    devices = sorted({str(m.get("device_label", "")) for m in ctx.metas.values() if m.get("device_label")})
    kept = (
        [f"Read from the tables kept in `{ctx.kept}` (nothing trained for this report).  "]
        if ctx.kept
        else []
    )
    return [
        "# What was reproduced: the papers' claims checked here",
        "",
        f"Profile: {ctx.profile}. {summary(frame)}. Data: {'; '.join(data) or '-'}. Speed measured on: "
        f"{'; '.join(devices) or '-'}.  ",
        *kept,
        "Each verdict is computed from the measurement in its details (tables/claims/): a difference counts"
        f" when it lies beyond the {LEVEL:.0%} interval of the noise (the seeds' spread with Student's t, "
        "and the test set's error). An INT8 - FP32 difference, and one row's INT8 against another's where "
        "the table's runs are kept (`<table>.runs.csv.gz`), is paired seed by seed and image by image "
        "(tables/delta_interval.py); without the runs, Welch's t and the two test sets' binomial errors "
        "added (an upper bound). With one seed there is no spread and the verdict is inconclusive. A "
        "difference the paper claims that is not significant here counts as not reproduced when the paper's"
        " own difference lies outside its 95% interval (smaller here than the paper's; the Open Science "
        "Collaboration's replication criterion, Science 2015), else as inconclusive.",
        "",
        f"**Measured at the {ctx.profile} profile on stand-in data and short schedules: these are not "
        "reproductions of the papers' ImageNet, CIFAR-10, COCO or Kinetics numbers.**",
        "",
    ]


def table(frame: pd.DataFrame) -> list[str]:
    """The compact table: one line a claim, its key number and the first clause of its reason."""
    lines = ["| Claim | Source | Verdict | Key number | Reason |", "|---|---|---|---|---|"]
    for r in frame.to_dict("records"):
        cited = cite(r["paper"], r["source"])
        claim = f"[{cell(r['claim'])}](#{r['key']})"
        cells = [
            claim,
            cell(cited),
            f"**{r['verdict']}**",
            cell(r["key_number"]),
            cell(short_reason(r["reason"])),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def details(frame: pd.DataFrame) -> list[str]:
    """Each claim's whole measurement (one part a line), its whole reason and its commands."""
    lines = ["## Details", ""]
    for r in frame.to_dict("records"):
        reason = f": {r['reason']}" if cell(r["reason"]) else ""
        lines += [
            f"### {r['key']}",
            "",
            f"{r['claim']} ({cite(r['paper'], r['source'])}). **{r['verdict']}**{reason}",
            "",
        ]
        parts = split_top_level(cell(r["measurement"]))
        lines += ["Measured:", "", *(f"- {p}" for p in parts), ""] if parts else []
        failed = [f for f in cell(r.get("failed_cells")).split("\n") if f]
        lines += (
            ["Failed cells (not in the measurement):", "", *(f"- {f}" for f in failed), ""] if failed else []
        )
        commands = [c for c in cell(r["commands"]).split("; ") if c]
        lines += ["Made by:", "", *(f"    {c}" for c in commands), ""] if commands else []
    return lines


def markdown(frame: pd.DataFrame, ctx: Context) -> str:
    again = (
        f"`make keep FROM=results` then puts the new tables and figures in `{ctx.kept}`, and `make claims "
        f"KEPT={ctx.kept}` reads them"
        if ctx.kept
        else "`make claims` then reads them from the cache"
    )
    lines = [*_header(frame, ctx), *table(frame), "", "Each claim's details end with the commands that make "
             f"what it reads (into `results/`); {again}.", "", *details(frame)]  # fmt: skip
    lines.append(
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `make claims PROFILE={ctx.profile}"
        + (f" KEPT={ctx.kept}" if ctx.kept else "")
        + (f" RESULTS={ctx.results_dir}`" if ctx.results_dir != Path("results") else "`")
        + f", at {provenance.line()}."
    )
    return "\n".join(lines) + "\n"
