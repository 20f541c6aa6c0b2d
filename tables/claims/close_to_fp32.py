"""The central claim of DAIQ and UI8: INT8 training stays within about one point of FP32 across models
(DAIQ Tables 3, 4 and 6; UI8 Tables 6 and 7), row by row, each row's 95% interval against +-1 point."""

from __future__ import annotations

from tables.claims.context import Context
from tables.claims.intervals import half_width, mean_over_models, num, within_a_point
from tables.claims.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim, Verdict, seeds_note
from tables.delta_interval import seeds_to_settle

CLOSE_TO_FP32_TABLES = ("table3", "table4", "table6", "ui8-table6", "ui8-table7")


def _means_over_models(name: str, by_method: dict[str, list[float]]) -> list[tuple[int, str]]:
    """Each method's mean over the table's models, as (models, text)."""
    out = []
    for method, deltas in by_method.items():
        if (m := mean_over_models(deltas)) is not None:
            mean, half = m
            ci = f"[{mean - half:+.2f}, {mean + half:+.2f}]"
            out.append((len(deltas), f"{name} {method} over {len(deltas)} models {mean:+.2f} {ci}"))
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
            delta, half = num(r["delta"]), half_width(r)
            o = within_a_point(delta, half)
            if o == "outside":  # which way matters to the reader: a loss, or FP32 trailing INT8
                o = "outside-below" if delta < 0 else "outside-above"
            outcomes.append(o)
            if delta is not None:  # method, not label: "Ours" is DAIQ or UI8 by paper
                where = f" ({r['dataset']})" if several_datasets else ""
                spread = num(r.get("delta_std"))
                if o == "straddles" and spread is not None:
                    seeds = int(min(r["n_int8"], r["n_fp32"]))
                    settle = seeds_to_settle(
                        spread, num(r.get("delta_test_se")), seeds, abs(abs(delta) - 1.0)
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
        measured += "; ".join(text for _, text in means)
    # the key: how many rows' intervals lie inside +-1, and the mean over the most models
    key = f"{outcomes.count('inside')} of {len(outcomes)} rows' intervals inside ±1 point"
    if means:
        key += "; mean of " + max(means, key=lambda m: m[0])[1]
    if not outcomes:
        return Verdict(INCONCLUSIVE, measured, "no row finished")
    lost, gained = outcomes.count("outside-below"), outcomes.count("outside-above")
    if lost or gained:
        said = [f"{lost} lose more than a point"] if lost else []
        if gained:
            said.append(f"{gained} score more than a point above FP32 (a weak FP32 baseline at this scale)")
        return Verdict(NOT_REPRODUCED, measured, f"of {len(outcomes)} rows, " + " and ".join(said), key)
    if "unknown" in outcomes:
        n = outcomes.count("unknown")
        return Verdict(INCONCLUSIVE, measured, f"{n} of {len(outcomes)} rows have one seed: no interval", key)
    if "straddles" in outcomes:
        n = outcomes.count("straddles")
        reason = f"{n} of {len(outcomes)} rows' intervals cross one point" + seeds_note(needs)
        return Verdict(INCONCLUSIVE, measured, reason, key)
    return Verdict(REPRODUCED, measured, key=key)


CLAIMS = (
    Claim("close-to-fp32", "DAIQ / UI8", "DAIQ Tables 3, 4 and 6; UI8 Tables 6 and 7",
          "DAIQ and UI8 stay within about one point of FP32 across models", _close_to_fp32,
          CLOSE_TO_FP32_TABLES),
)  # fmt: skip
