"""WAGEUBN's claims (Yang et al., Neural Networks 2020): the error path E2 in 8 bits, which its Flag QE2
quantizer makes trainable."""

from __future__ import annotations

import math

from tables.claims.context import Context, final_top1
from tables.claims.intervals import compare_rows, estimate, how_compared
from tables.claims.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim, Verdict, seeded_verdict


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
    measured = "; ".join(parts) + f" ({how_compared(comparisons)})"
    contrary = "full 8-bit E2 is significantly better somewhere"
    v = seeded_verdict(comparisons, names, measured, "above", contrary)
    v.key = f"16-bit E2 - full 8-bit on {v.key}" if v.key else ""
    return v


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
        + f" ({how_compared(list(comparisons.values()))})"
    )
    contrary = "quantizing E2 alone costs significantly less than another path"
    names = [f"E2 - {k}" for k in comparisons]
    return seeded_verdict(list(comparisons.values()), names, measured, "below", contrary)


def _flag_keeps_nonzeros(ctx: Context) -> Verdict:
    ratios = ctx.figure("wageubn-figure10").groupby("quantizer")["data_ratio_mean"].mean()
    zeros = ctx.figure("wageubn-figure9").dropna(subset=["zeros"]).groupby("panel")["zeros"].last()
    plain, flag = ratios.get("8-bit QE2"), ratios.get("8-bit Flag QE2")
    measured = (
        f"share of e_l3 values kept nonzero, mean over ResNet-18 layers: Flag QE2 {flag:.2f}, "
        f"plain 8-bit QE2 {plain:.2f}; zeros: " + ", ".join(f"{k} {v:.2f}" for k, v in zeros.items())
    )
    key = f"share of the error's values kept nonzero: Flag QE2 {flag:.2f}, plain 8-bit QE2 {plain:.2f}"
    if flag > plain:
        return Verdict(REPRODUCED, measured, key=key)
    return Verdict(NOT_REPRODUCED, measured, "plain 8-bit QE2 keeps as many values", key)


def _plain_qe2_fails(ctx: Context) -> Verdict:
    top1 = final_top1(ctx.figure("wageubn-figure9"))
    plain = next((v for k, v in top1.items() if "shift8" in k), None)
    flag = next((v for k, v in top1.items() if "Flag" in k), None)
    if plain is None or flag is None:
        return Verdict(INCONCLUSIVE, "", "the figure lacks the plain or the Flag QE2 run")
    measured = "final top-1: " + ", ".join(f"{k} {v:.1f}" for k, v in top1.items())
    key = f"final top-1 plain 8-bit QE2 {plain:.1f}, Flag QE2 {flag:.1f} (one run each)"
    if math.isnan(plain) or plain < flag - 10.0:  # a failure, not a difference within a run's noise
        return Verdict(REPRODUCED, measured, key=key)
    return Verdict(NOT_REPRODUCED, measured, "plain 8-bit QE2 trains at this scale", key)


CLAIMS = (
    Claim("wageubn-e2", "WAGEUBN", "Table I",
          "The full 8-bit version (Flag QE2) is worse than the 16-bit E2 version",
          _flag_e2_worse_than_16_bit, ("wageubn-table1",)),
    Claim("wageubn-sensitivity", "WAGEUBN", "Table II",
          "E2 is the most sensitive data path: quantizing it alone costs the most accuracy",
          _e2_most_sensitive, ("wageubn-table2",)),
    Claim("wageubn-flag-nonzeros", "WAGEUBN", "Figures 9 and 10",
          "Flag QE2 keeps more of the error's values than plain 8-bit QE2", _flag_keeps_nonzeros,
          ("wageubn-figure9", "wageubn-figure10")),
    Claim("wageubn-plain-qe2", "WAGEUBN", "Figure 9",
          "Plain 8-bit QE2 fails where Flag QE2 trains", _plain_qe2_fails, ("wageubn-figure9",)),
)  # fmt: skip
