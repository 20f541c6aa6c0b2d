"""What the figures share: matplotlib set-up, the title that names the figure and where its data come
from, the PNG + CSV pair, curves of recorded runs and histograms of recorded records."""

from __future__ import annotations

import csv
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tables import provenance
from tables.figures.runs import RecordedRun


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "legend.fontsize": 7.5, "figure.dpi": 110})
    return plt


def scale_note(profile: str) -> str:
    if profile == "paper":
        return "the paper's protocol"
    return f"{profile} profile: stand-in data and a short schedule, not the paper's scale"


def trained_at(runs: Iterable[RecordedRun]) -> list[str]:
    """The commits that trained the runs; runs recorded before runs kept their commit add none."""
    return sorted({r.meta["trained_at"]["commit"] for r in runs if "trained_at" in r.meta})


def made_by(runs: Sequence[RecordedRun]) -> str:
    """E.g. "drawn at commit 0123456789ab, environment lock 89abcdef0123 (constraints.txt); runs trained at
    commit 0123456789ab"."""
    commits = trained_at(runs)
    trained = f"runs trained at commit {', '.join(commits)}" if commits else "the runs' commit not recorded"
    return f"drawn at {provenance.line()}; {trained}"


def title(fig, what: str, runs: Sequence[RecordedRun], detail: str = "") -> None:
    """Suptitle: the paper's figure and what it shows; then the profile, data, models, device, commit."""
    first = runs[0]
    data = sorted({r.data for r in runs})
    models = sorted({r.spec.model for r in runs})
    lines = [
        f"{what} (regenerated; {scale_note(first.profile)})",
        f"data: {'; '.join(data)} | model: {', '.join(models)} | {first.meta['device']}",
    ]
    if detail:
        lines.append(detail)
    lines.append(made_by(runs))
    width = int(fig.get_figwidth() * 15)  # characters of 8.5 pt text per line of the figure's width
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in lines), fontsize=8.5)


def save(fig, rows: list[dict[str, Any]], out: Path, name: str) -> list[Path]:
    """Write <out>/<name>.png and <out>/<name>.csv (the plotted data, one row per plotted point)."""
    out.mkdir(parents=True, exist_ok=True)
    png, csv_path = out / f"{name}.png", out / f"{name}.csv"
    fig.savefig(png)
    import matplotlib.pyplot as plt

    plt.close(fig)
    write_csv(csv_path, rows)
    return [png, csv_path]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def iterations_text(iterations: Iterable[int]) -> str:
    its = sorted(set(iterations))
    if len(its) <= 6:
        return ", ".join(map(str, its))
    return f"{its[0]}..{its[-1]} ({len(its)} iterations)"


# ------------------------------------------------------------------------------------------ curves
def top1_text(run: RecordedRun) -> str:
    top1 = run.result.get("top1")
    return f"diverged at iteration {run.result['iters']}" if run.diverged or top1 is None else f"{top1:.1f}%"


def smooth(values: Sequence[float | None], window: int) -> np.ndarray:
    """A trailing moving average (NaN where there is no value), so a noisy loss reads at a glance."""
    v = np.array([np.nan if x is None else x for x in values], dtype=float)
    if window <= 1 or v.size == 0:
        return v
    out = np.full_like(v, np.nan)
    for i in range(v.size):
        chunk = v[max(0, i - window + 1) : i + 1]
        chunk = chunk[np.isfinite(chunk)]
        out[i] = chunk.mean() if chunk.size else np.nan
    return out


def val_points(run: RecordedRun, metric: str = "cls/top1") -> tuple[list[int], list[float]]:
    points = sorted((v["iteration"], v[metric]) for v in run.curves["val"] if metric in v)
    return [p[0] for p in points], [p[1] for p in points]


def curves(axes, runs: dict[str, RecordedRun], rows: list[dict[str, Any]], window: int | None = None) -> None:
    """Training loss (moving average) on axes[0] and validation top-1 on axes[1] for each labelled run;
    a diverged run is marked where it stopped. Appends the plotted points to `rows`."""
    ax_loss, ax_acc = axes
    for label, run in runs.items():
        its = run.curves["iteration"]
        w = window or max(1, len(its) // 25)
        loss = smooth(run.curves["loss"], w)
        (line,) = ax_loss.plot(its, loss, label=label, linewidth=1.2)
        vx, vy = val_points(run)
        ax_acc.plot(vx, vy, marker="o", markersize=3, label=label, color=line.get_color(), linewidth=1.2)
        if run.diverged:
            stop = run.result["iters"]
            for ax in axes:
                ax.axvline(stop, color=line.get_color(), linestyle=":", linewidth=1)
            ax_loss.annotate(
                f"{label}: diverged at it. {stop}",
                (stop, np.nanmax(loss) if its else 0),
                fontsize=7,
                color=line.get_color(),
                ha="right",
            )
        points = zip(its, run.curves["loss"], loss, run.curves["lr"], strict=True)
        rows.extend(
            {"run": label, "iteration": i, "loss": raw, "loss_smoothed": s, "lr": lr}
            for i, raw, s, lr in points
        )
        rows.extend({"run": label, "iteration": i, "val_top1": a} for i, a in zip(vx, vy, strict=True))
    ax_loss.set_xlabel("iteration")
    ax_loss.set_ylabel("training loss (moving average)")
    ax_acc.set_xlabel("iteration")
    ax_acc.set_ylabel("validation top-1 (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()


# ------------------------------------------------------------------------------------- histograms
def centres(bins: int, limit: float) -> np.ndarray:
    edges = np.linspace(-limit, limit, bins + 1)
    return (edges[:-1] + edges[1:]) / 2


def density(counts: Sequence[int], limit: float) -> np.ndarray:
    c = np.asarray(counts, dtype=float)
    width = 2 * limit / max(1, c.size)
    return c / max(1.0, c.sum()) / (width if width > 0 else 1.0)


def hist_rows(label: str, record: dict[str, Any], counts: Sequence[int], **extra: Any) -> list[dict]:
    limit = record["absmax"]
    where = {
        "series": label,
        "layer": record["layer"],
        "path": record["path"],
        "iteration": record["iteration"],
    }
    return [
        {**where, "bin_centre": float(x), "count": int(n), **extra}
        for x, n in zip(centres(len(counts), limit), counts, strict=True)
    ]


def short(layer: str) -> str:
    return layer.removeprefix("net.")
