"""UI8's claims (Zhu et al., CVPR 2020): clipping, its update period, the gradients' distributions and
the learning-rate scaling. The figure claims read one recorded run per curve: a difference between single
runs is only a direction, unless the claim is about an effect as large as a failure."""

from __future__ import annotations

import math

import pandas as pd

from tables.claims.context import Context, crashed, final_top1, row
from tables.claims.intervals import Estimate, compare_rows, estimate, how_compared, num
from tables.claims.verdict import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    ONE_RUN,
    REPRODUCED,
    Claim,
    Verdict,
    direction,
    seeds_note,
)
from tables.delta_interval import seeds_to_settle


def _top1s(top1: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in top1.items())


def _clipping_fixes_the_crash(ctx: Context) -> Verdict:
    frame = ctx.table("ui8-table3")
    no_clip = row(frame, label="No clipping")
    clip = row(frame, label="Direction Sensitive Gradient Clipping")
    crashed_ = "diverged" in str(no_clip["status"])
    clip_ok = str(clip["status"]).startswith("ok")
    measured = (
        f"MobileNetV2 INT8 without clipping: {no_clip['status']} (top-1 {estimate(no_clip).text()}); with "
        f"clipping: {clip['status']} (top-1 {estimate(clip).text()}); {no_clip['dataset']}"
    )
    key = f"top-1 without clipping {estimate(no_clip).text()} ({no_clip['status']})"
    if crashed_ and clip_ok:
        return Verdict(REPRODUCED, measured, key=key)
    if not crashed_ and clip_ok:
        return Verdict(NOT_REPRODUCED, measured, "no crash without clipping at this scale and budget", key)
    return Verdict(INCONCLUSIVE, measured, "the clipped run diverged too", key)


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
        f"top-1 period 1 {p1.text()}, period 100 {p100.text()}, difference {c.text()} ({how_compared([c])}) "
        f"(UI8 Table 5, paper 93.66 -> 93.38); "
        f"s/iter period 1 {t[1]:.3f}, 100 {t[100]:.3f}, 1000 {t[1000]:.3f} (UI8 Table 2 on "
        f"{speed['device'].iloc[0]})"
    )
    key = f"period 100 - period 1 {c.text()}; its time {t[100] / t[1]:.2f}x period 1's"
    if not saves:
        return Verdict(NOT_REPRODUCED, measured, "the longer period saves no time here", key)
    if drop == "below":
        return Verdict(NOT_REPRODUCED, measured, "period 100 loses more than one point", key)
    if drop == "unknown":
        return Verdict(INCONCLUSIVE, measured, "one seed: no estimate of the accuracy's noise", key)
    if drop == "within":  # not shown to lose less than a point either
        needs = {"period 100 - period 1": c.seeds_to_settle()} if c.spread is not None else {}
        reason = "the seeds' spread is wider than the point the claim allows" + seeds_note(needs)
        return Verdict(INCONCLUSIVE, measured, reason, key)
    return Verdict(REPRODUCED, measured, key=key)


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
    # the key: the gradient fit nearest acceptance (the smallest D_n against its critical value)
    fits = [(r[d] / r["critical"], r, d) for r in frame.to_dict("records") if r["data"] == "g" for d in dists]
    key = ""
    if fits:
        _, r, d = min(fits, key=lambda f: f[0])
        key = f"closest gradient fit: {r['layer']} {d} D_n {r[d]:.3f} (critical {r['critical']:.4f})"
    if g_all_rejected and w_some_accepted:
        return Verdict(REPRODUCED, measured, key=key)
    why = []
    if not g_all_rejected:
        why.append("a gradient is not rejected by every fit")
    if not w_some_accepted:
        why.append("a weight is rejected by every fit")
    return Verdict(NOT_REPRODUCED, measured, "; ".join(why), key)


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
    parts, changes, ratios = [], [], []
    for panel, what in panels.items():
        stds = [_histogram_std(g) for _, g in frame[frame["panel"] == panel].groupby("series")]
        stds = [v for v in stds if v > 0]
        ratio = max(stds) / min(stds) if len(stds) > 1 else math.nan
        changes.append(ratio >= 2.0)
        ratios.append(f"{ratio:.1f}x")
        parts.append(f"{what}: std of g spans {ratio:.1f}x over {len(stds)} histograms")
    measured = "MobileNetV2 gradients (UI8 Fig. 3 panels b-d): " + "; ".join(parts)
    key = "std of g spans " + " / ".join(ratios) + " (iterations / depth / structure)"
    if all(changes):
        return Verdict(REPRODUCED, measured, key=key)
    return Verdict(NOT_REPRODUCED, measured, "a spread changes by less than 2x", key)


def _lower_lr_delays_the_crash(ctx: Context) -> Verdict:
    frame = ctx.figure("ui8-figure4")
    top1 = final_top1(frame[frame["panel"] == "b"])
    measured = "final top-1 without clipping: " + _top1s(top1)
    fixed = {k: v for k, v in top1.items() if "no scaling" in k}
    lowest = min(fixed, key=fixed.get) if fixed else None
    key = f"lowest final top-1 without clipping: {lowest} {fixed[lowest]:.1f}" if lowest else ""
    crashed_ = [k for k, v in top1.items() if "no scaling" in k and crashed(v)]
    if not crashed_:
        return Verdict(
            INCONCLUSIVE, measured, "no run without clipping crashed at this scale: no crash to delay", key
        )
    return Verdict(INCONCLUSIVE, measured, f"crashed: {', '.join(crashed_)}; {ONE_RUN}", key)


def _phi_scaling_beats_fixed_rates(ctx: Context) -> Verdict:
    frame = ctx.figure("ui8-figure4")
    paired = frame[frame["panel"] == "b-paired"] if "panel" in frame else frame.iloc[:0]
    if len(paired) and (paired["seeds"] >= 2).all():
        return _phi_against_each_rate(frame[frame["panel"] == "b-final"], paired)
    top1 = final_top1(frame.query("panel == 'b'"))
    phi = {k: v for k, v in top1.items() if "with phi" in k}
    fixed = {k: v for k, v in top1.items() if "no scaling" in k}
    if not phi or not fixed:
        return Verdict(INCONCLUSIVE, "", "the figure has no phi-scaled or no fixed-rate run")
    measured = "final top-1: " + _top1s(top1)
    key = f"final top-1 phi scaling {min(phi.values()):.1f}, best fixed rate {max(fixed.values()):.1f}"
    return direction(min(phi.values()) > max(fixed.values()), measured, key)


def _phi_against_each_rate(finals: pd.DataFrame, paired: pd.DataFrame) -> Verdict:
    """The seeded reading of UI8 Figure 4b: eta1 (phi scaling) minus each fixed rate, paired seed by seed
    and image by image (the figure's "b-paired" rows, tables.delta_interval)."""
    tops = finals.dropna(subset=["val_top1"]).groupby("run")["val_top1"]
    measured = "final top-1 over seeds: " + ", ".join(
        f"{run} {Estimate(g.mean(), g.std() if len(g) > 1 else None, len(g)).text()}" for run, g in tops
    )
    parts, below, needs, missing, texts, lows = [], [], {}, [], {}, {}
    for r in paired.to_dict("records"):
        delta, half = float(r["delta"]), float(r["half_width"])
        if math.isnan(delta) or math.isnan(half):  # a setting whose runs all diverged: nothing to compare
            parts.append(f"{r['run']} n/a")
            missing.append(r["run"])
            continue
        parts.append(f"{r['run']} {delta:+.2f} [{delta - half:+.2f}, {delta + half:+.2f}]")
        texts[r["run"]], lows[r["run"]] = f"eta1 - {parts[-1]}", delta - half
        if delta + half < 0:
            below.append(r["run"])
        elif delta - half <= 0:
            needs[r["run"]] = seeds_to_settle(
                num(r["spread"]), num(r["test_se"]), int(r["seeds"]), abs(delta)
            )
    measured += "; eta1 minus each (paired seed by seed and image by image): " + ", ".join(parts)
    if below:
        return Verdict(
            NOT_REPRODUCED, measured, f"phi(d_c) scaling is significantly below {', '.join(below)}",
            texts[below[0]],
        )  # fmt: skip
    if missing:
        reason = f"no interval for {', '.join(missing)} (its runs diverged)"
        return Verdict(INCONCLUSIVE, measured, reason, f"eta1 - {missing[0]} n/a")
    if needs:
        hardest = max(needs, key=lambda k: math.inf if needs[k] is None else needs[k])
        reason = "differences within the seeds' spread" + seeds_note(needs)
        return Verdict(INCONCLUSIVE, measured, reason, texts[hardest])
    return Verdict(REPRODUCED, measured, key=texts[min(lows, key=lows.get)] if lows else "")


def _weaker_forms_crash(ctx: Context) -> Verdict:
    # UI8 sec. 4.1 on Figure 6(b): the linear and quadratic forms "are too weak to control optimization
    # direction ... and model crashes"; the exponential one prevents it. A crash shows in one run.
    top1 = final_top1(ctx.figure("ui8-figure6"))
    exp = [v for k, v in top1.items() if k.startswith("exponential")]
    others = {k: v for k, v in top1.items() if not k.startswith("exponential")}
    if not exp or not others:
        return Verdict(INCONCLUSIVE, "", "the figure lacks a scaling form")
    measured = "final top-1: " + _top1s(top1)
    key = "final top-1 " + ", ".join(f"{k.split()[0]} {v:.1f}" for k, v in top1.items())
    if crashed(exp[0]):
        return Verdict(NOT_REPRODUCED, measured, "the exponential form crashed too", key)
    crashed_ = [k for k, v in others.items() if crashed(v)]
    if len(crashed_) == len(others):
        return Verdict(REPRODUCED, measured, key=key)
    if not crashed_:
        return Verdict(INCONCLUSIVE, measured, "no form crashed at this scale: no crash to prevent", key)
    trained = ", ".join(k for k in others if k not in crashed_)
    return Verdict(NOT_REPRODUCED, measured, f"{trained} trained where the paper's crashed", key)


CLAIMS = (
    Claim("ui8-clipping", "UI8", "Figure 2, Table 3",
          "MobileNetV2 INT8 training without gradient clipping crashes; direction-sensitive clipping "
          "fixes it",
          _clipping_fixes_the_crash, ("ui8-table3",)),
    Claim("ui8-period", "UI8", "Tables 2 and 5",
          "A longer clip-update period costs little accuracy and saves time",
          _period_costs_little, ("ui8-table5", "ui8-table2")),
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
)  # fmt: skip
