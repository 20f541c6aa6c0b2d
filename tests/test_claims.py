"""The claims report: verdicts computed from measurements (fake tables here), the report's files."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tables import claims
from tables.claims import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Context,
    Estimate,
    close_to_fp32,
    compare,
    daiq,
    intervals,
    registry,
    speed,
    ui8,
    verdict,
    wageubn,
)
from tables.render import RUNS_COLUMNS
from tasks.top1 import pack_flags


def _row(label, method="ui8", int8=90.0, std=0.5, n=2, status="ok", **extra):
    base = dict(label=label, method=method, int8=int8, int8_std=std, n_int8=n, fp32=None, fp32_std=None,
                n_fp32=0, status=status, dataset="stand-in", options="", model="m", bits="")  # fmt: skip
    return base | extra


def context(**frames) -> Context:
    ctx = Context(profile="smoke")
    for name, rows in frames.items():
        ctx.frames[name.replace("_", "-")] = pd.DataFrame(rows)
        ctx.commands[name.replace("_", "-")] = f"repro table {name} --profile smoke"
    return ctx


def test_compare_needs_two_seeds_and_a_difference_beyond_the_spread():
    a, b = Estimate(91.0, 0.2, 3), Estimate(90.0, 0.2, 3)
    assert compare(a, b) == "above" and compare(b, a) == "below"
    assert compare(Estimate(90.1, 1.0, 2), b) == "within"
    assert compare(Estimate(91.0, None, 1), b) == "unknown"
    # two seeds a side leave Student's t at about 4.3: the same spread no longer separates them
    assert compare(Estimate(91.0, 0.2, 2), Estimate(90.0, 0.2, 2)) == "above"
    assert compare(Estimate(90.5, 0.2, 2), Estimate(90.0, 0.2, 2)) == "within"
    # the test sets' error counts as well as the seeds'
    assert compare(Estimate(91.0, 0.2, 3, test_se=0.4), Estimate(90.0, 0.2, 3, test_se=0.4)) == "within"
    # margin -1: 'above' = a lost less than one point against b, beyond the spread; 'below' = more
    assert compare(Estimate(89.5, 0.1, 4), b, margin=-1.0) == "above"
    assert compare(Estimate(88.0, 0.1, 4), b, margin=-1.0) == "below"


def test_clipping_claim():
    crash = [_row("No clipping", status="diverged (2 of 2 seeds)", int8=None, n=0),
             _row("Direction Sensitive Gradient Clipping")]  # fmt: skip
    assert ui8._clipping_fixes_the_crash(context(ui8_table3=crash)).verdict == REPRODUCED
    no_crash = [_row("No clipping"), _row("Direction Sensitive Gradient Clipping")]
    v = ui8._clipping_fixes_the_crash(context(ui8_table3=no_crash))
    assert v.verdict == NOT_REPRODUCED and "no crash" in v.reason


def test_ablation_claim_verdicts():
    def table(gvq, mcs, both, n=3):
        return [_row("GQ", "gq", 90.0, 0.2, n), _row("GVQ", "daiq-gvq", gvq, 0.2, n),
                _row("MCS", "daiq-mcs", mcs, 0.2, n), _row("both", "daiq", both, 0.2, n)]  # fmt: skip

    assert daiq._daiq_ablations_beat_gq(context(table2=table(91, 91, 92))).verdict == REPRODUCED
    assert daiq._daiq_ablations_beat_gq(context(table2=table(89, 91, 92))).verdict == NOT_REPRODUCED
    v = daiq._daiq_ablations_beat_gq(context(table2=table(90.1, 90.2, 90.0)))
    assert v.verdict == INCONCLUSIVE and "spread" in v.reason
    v = daiq._daiq_ablations_beat_gq(context(table2=table(91, 91, 92, n=1)))
    assert v.verdict == INCONCLUSIVE and "one seed" in v.reason


def _runs(by_row: dict[int, list[float]], n_images=1000, flags=True) -> pd.DataFrame:
    """Each row's INT8 runs, one per seed, the first value% of n_images images right (no flags: '')."""

    def packed(v):
        right = round(v * n_images / 100)
        return pack_flags([int(i < right) for i in range(n_images)]) if flags else ""

    lines = [dict(row=r, model="m", method="x", label="x", options="", seed=seed, precision="int8", value=v,
                  diverged=False, flags=packed(v))
             for r, values in by_row.items() for seed, v in enumerate(values)]  # fmt: skip
    return pd.DataFrame(lines, columns=RUNS_COLUMNS)


def test_two_rows_with_kept_runs_are_compared_seed_by_seed_and_image_by_image(tmp_path):
    # the seeds move GQ and every ablation together (89, 90, 91), each ablation 0.6 above GQ in every seed:
    # unpaired, the seeds' spread (1 point) hides the 0.6; paired, it is the same in each seed
    rows = [
        _row(label, method, mean, 1.0, 3, int8_test_se=0.95)
        for label, method, mean in (
            ("GQ", "gq", 90.0),
            ("GVQ", "daiq-gvq", 90.6),
            ("MCS", "daiq-mcs", 90.6),
            ("both", "daiq", 90.6),
        )
    ]
    seeds = {0: [89.0, 90.0, 91.0]} | {r: [89.6, 90.6, 91.6] for r in (1, 2, 3)}  # fmt: skip
    unpaired = daiq._daiq_ablations_beat_gq(context(table2=rows))
    assert unpaired.verdict == INCONCLUSIVE and intervals.UNPAIRED_NOTE in unpaired.measurement
    ctx = context(table2=rows)
    ctx.run_frames["table2"] = _runs(seeds)
    paired = daiq._daiq_ablations_beat_gq(ctx)
    assert paired.verdict == REPRODUCED and intervals.PAIRED_NOTE in paired.measurement
    c = claims.compare_rows(ctx, "table2", ctx.frames["table2"].iloc[1], ctx.frames["table2"].iloc[0])
    assert c.paired and c.delta == pytest.approx(0.6) and 0 < c.half_width < 0.6
    # kept: the runs file beside the table's CSV
    pd.DataFrame(rows).to_csv(tmp_path / "table2.csv", index=False)
    _runs(seeds).to_csv(tmp_path / "table2.runs.csv.gz", index=False)
    kept = Context(profile="embedded", results_dir=tmp_path / "out", kept=tmp_path)
    assert daiq._daiq_ablations_beat_gq(kept).verdict == REPRODUCED
    # a run without its flags: only the unpaired bound is sound
    ctx = context(table2=rows)
    ctx.run_frames["table2"] = _runs(seeds, flags=False)
    assert daiq._daiq_ablations_beat_gq(ctx).verdict == INCONCLUSIVE


def test_e2_sensitivity_claim():
    def table(e2):
        rows = [_row(f"k{p} = 8", "wageubn", 95.0, 0.2, 3, options=f"quantize_only={p}")
                for p in ("W", "BN", "A", "GW", "E1")]  # fmt: skip
        return rows + [_row("kE2 = 8", "wageubn", e2, 0.2, 3, options="quantize_only=E2")]

    assert wageubn._e2_most_sensitive(context(wageubn_table2=table(93.0))).verdict == REPRODUCED
    v = wageubn._e2_most_sensitive(context(wageubn_table2=table(97.0)))
    assert v.verdict == NOT_REPRODUCED and "E2" in v.measurement


def test_a_difference_smaller_than_the_papers_is_not_reproduced():
    # 16-bit E2 0.5 above full 8-bit, 3 seeds of spread 0.4: not significant, and its interval ends
    # below the paper's 2.6 on the first network but holds the second network's 0.9
    def table(paper_gap, gap=0.5, std=0.4):
        return [_row("full", "wageubn", 90.0, std, 3, model="r18", paper_int8=64.8),
                _row("e2-16", "wageubn-e2-16", 90.0 + gap, std, 3, model="r18", paper_int8=64.8 + paper_gap),
                _row("full", "wageubn", 80.0, std, 3, model="r34", paper_int8=67.6),
                _row("e2-16", "wageubn-e2-16", 80.5, std, 3, model="r34", paper_int8=68.5)]  # fmt: skip

    v = wageubn._flag_e2_worse_than_16_bit(context(wageubn_table1=table(2.6)))
    assert v.verdict == NOT_REPRODUCED and verdict.SMALLER_THAN_PAPER in v.reason
    assert "r18 (paper +2.60)" in v.reason and "r34" not in v.reason and "(paper +0.90)" in v.measurement
    # the paper's difference inside every interval: no verdict either way
    v = wageubn._flag_e2_worse_than_16_bit(context(wageubn_table1=table(0.9)))
    assert v.verdict == INCONCLUSIVE
    # a paper difference the other way is no evidence about this claim's direction
    assert wageubn._flag_e2_worse_than_16_bit(context(wageubn_table1=table(-2.6))).verdict == INCONCLUSIVE
    # without the paper's numbers (an older table): as before
    rows = [{k: v for k, v in r.items() if k != "paper_int8"} for r in table(2.6)]
    assert wageubn._flag_e2_worse_than_16_bit(context(wageubn_table1=rows)).verdict == INCONCLUSIVE
    # a significant difference the claimed way is reproduced, whatever its size against the paper's
    assert (
        wageubn._flag_e2_worse_than_16_bit(context(wageubn_table1=table(5.0, gap=1.0, std=0.05))).verdict
        == REPRODUCED
    )


def test_speed_claims_read_the_paired_ratios():
    base = dict(paper_iteration_vs_fp16=0.85, paper_iteration_vs_fp32=0.49, iteration_ms=100.0, batch=16,
                size=224, device="a CPU")  # fmt: skip
    rows = [
        dict(base, method="daiq", precision="INT8", iteration_vs_fp16=0.05, iteration_vs_fp32=0.85),
        dict(base, method="bf16", precision="FP16", iteration_vs_fp16=1.0, iteration_vs_fp32=17.5),
    ]
    ui8 = [dict(base, method="ui8", precision="INT8", iteration_vs_fp16=None, iteration_vs_fp32=0.8,
                paper_iteration_vs_fp32=0.81)]  # fmt: skip
    ctx = context(table7=rows, ui8_table10=ui8)
    assert speed._int8_faster("FP32")(ctx).verdict == REPRODUCED
    assert "UI8 Table 10" in speed._int8_faster("FP32")(ctx).measurement
    v = speed._int8_faster("FP16")(ctx)
    assert v.verdict == INCONCLUSIVE and "emulated" in v.reason
    rows[0]["iteration_vs_fp32"] = 1.3
    assert speed._int8_faster("FP32")(context(table7=rows, ui8_table10=ui8)).verdict == NOT_REPRODUCED
    rows[0]["iteration_vs_fp32"], ui8[0]["iteration_vs_fp32"] = 0.85, 1.2  # UI8 alone slower: not reproduced
    assert speed._int8_faster("FP32")(context(table7=rows, ui8_table10=ui8)).verdict == NOT_REPRODUCED


def _timed(method: str, precision: str, vs_fp16: float | None, vs_fp32: float) -> dict:
    """A speed table's row, as the speed claims read it (no paper ratios)."""
    return dict(method=method, precision=precision, iteration_vs_fp16=vs_fp16, iteration_vs_fp32=vs_fp32,
                paper_iteration_vs_fp16=None, paper_iteration_vs_fp32=None, iteration_ms=100.0, batch=16,
                size=224, device="a CPU")  # fmt: skip


def test_speed_claims_read_compiled_variants_too():
    # `make table7 COMPILE=1` adds "<method>+compile" rows, each against the compiled baselines
    rows = [_timed("daiq", "INT8", 0.9, 0.6), _timed("bf16", "FP16", 1.0, 0.5),
            _timed("daiq+compile", "INT8", 0.8, 0.55), _timed("bf16+compile", "FP16", 1.0, 0.5)]  # fmt: skip
    ui8 = [_timed("ui8", "INT8", None, 0.6), _timed("ui8+compile", "INT8", None, 0.7)]
    v = speed._int8_faster("FP16")(context(table7=rows, ui8_table10=ui8))
    assert v.verdict == REPRODUCED and "DAIQ Table 7, compiled" in v.measurement and "0.80" in v.measurement
    assert speed._int8_faster("FP32")(context(table7=rows, ui8_table10=ui8)).verdict == REPRODUCED
    rows[2]["iteration_vs_fp16"] = 1.2  # compiled INT8 slower than compiled bf16: the claim fails
    v = speed._int8_faster("FP16")(context(table7=rows, ui8_table10=ui8))
    assert v.verdict == NOT_REPRODUCED and "1.20" in v.measurement
    ui8[1]["iteration_vs_fp32"] = 1.1  # UI8 compiled alone slower than compiled FP32
    assert speed._int8_faster("FP32")(context(table7=rows, ui8_table10=ui8)).verdict == NOT_REPRODUCED


def test_the_opt_in_speed_claim_reads_the_rows_with_16_bit_float_layers():
    # the INT8 method with its float layers under the FP16 row's autocast ("daiq+bf16" on the CPU, "daiq+fp16"
    # on CUDA), eager and compiled, against the same FP16 rows; the default claim keeps reading "daiq"
    rows = [_timed("bf16", "FP16", 1.0, 0.5), _timed("daiq", "INT8", 1.1, 0.6),
            _timed("daiq+bf16", "INT8", 0.82, 0.45), _timed("bf16+compile", "FP16", 1.0, 0.5),
            _timed("daiq+bf16+compile", "INT8", 0.9, 0.5)]  # fmt: skip
    opt_in = speed._int8_faster("FP16", speed.HALF_FLOAT_LAYERS)
    v = opt_in(context(table7=rows))
    assert v.verdict == REPRODUCED and "0.82" in v.measurement and "0.90" in v.measurement
    assert "16-bit float layers" in v.key and "0.82-0.90x" in v.key
    assert speed._int8_faster("FP16")(context(table7=rows)).verdict == NOT_REPRODUCED  # the default row
    rows[-1]["iteration_vs_fp16"] = 1.1  # compiled, the opt-in variant slower: not reproduced, and the reason
    v = opt_in(context(table7=rows))  # says which timing fails and which holds
    assert v.verdict == NOT_REPRODUCED
    assert (
        v.reason
        == "INT8 is slower than FP16 in DAIQ Table 7, compiled 1.10x, faster in DAIQ Table 7, eager 0.82x"
    )
    cuda = [dict(r, method=r["method"].replace("bf16", "fp16")) for r in rows]
    assert "DAIQ" in opt_in(context(table7=cuda)).measurement  # the device's half names the row
    with pytest.raises(KeyError, match="opt-in rows"):  # a table kept before they were timed
        opt_in(context(table7=rows[:2]))


def test_report_files_and_a_claim_that_cannot_be_measured(tmp_path):
    ctx = context()
    ctx.results_dir = tmp_path

    def boom(ctx):
        raise FileNotFoundError("no such table")

    frame, paths = claims.write(ctx, (claims.Claim("x", "UI8", "Table 0", "a claim", boom, ()),))
    assert list(frame.columns) == claims.CSV_COLUMNS
    assert frame["verdict"].tolist() == [INCONCLUSIVE] and "could not be measured" in frame["reason"][0]
    text = paths["md"].read_text()
    assert "not reproductions of the papers'" in text and "| [a claim](#x) | UI8 Table 0 |" in text
    assert "### x" in text and "could not be measured" in text.split("## Details", 1)[1]


@pytest.mark.parametrize("profile", ["tiny"])
def test_cli_rejects_an_unknown_profile(profile, capsys):
    assert claims.main(["--profile", profile]) == 2
    assert "unknown profile" in capsys.readouterr().err


def test_kept_results_are_read_and_a_missing_table_is_inconclusive(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    rows = [_row("Ours", method=m, int8=None, delta=d, delta_std=0.1, n_fp32=2, delta_ci95=0.5) for m, d in
            (("daiq", -0.2), ("ui8", 0.1), ("dorefa", -60.0))]  # fmt: skip
    for name in claims.CLOSE_TO_FP32_TABLES:
        pd.DataFrame(rows).to_csv(kept / f"{name}.csv", index=False)
    two_bit = _row(
        "Ours (2-bit W)",
        int8=None,
        delta=-8.0,
        delta_std=0.1,
        n_fp32=2,
        bits="2/8/8",
        model="m2",
        delta_ci95=0.5,
    )
    pd.DataFrame([*rows, two_bit]).to_csv(kept / "ui8-table7.csv", index=False)
    ctx = Context(profile="embedded", results_dir=tmp_path / "out", kept=kept)
    frame = claims.evaluate(ctx, [c for c in claims.CLAIMS if c.key in ("close-to-fp32", "ui8-clipping")])
    verdicts = dict(zip(frame["key"], frame["verdict"], strict=True))
    # DoReFa's -60 is not DAIQ's or UI8's, nor is 2-bit weights' -8 an 8-bit row: neither decides the claim
    assert verdicts == {"close-to-fp32": REPRODUCED, "ui8-clipping": INCONCLUSIVE}
    # a cell shared by several tables (DAIQ Table 3 and UI8 Table 6) is counted once
    assert frame.set_index("key").loc["close-to-fp32", "measurement"].count("m daiq -0.20") == 1
    reason = frame.set_index("key").loc["ui8-clipping", "reason"]
    assert "ui8-table3 is not among the kept results" in reason
    assert claims.main(["--kept", str(tmp_path / "nowhere")]) == 2


def _ks_row(data, g, lap, st, critical=0.02):
    return dict(layer="layer0 conv3", data=data, gaussian=g, laplace=lap, student=st, critical=critical)


def test_ks_claim_needs_every_gradient_fit_rejected_and_some_weight_fit_accepted():
    paper_like = [_ks_row("g", 0.2, 0.08, 0.2), _ks_row("w", 0.01, 0.07, 0.1)]
    student_fits = [_ks_row("g", 0.2, 0.08, 0.01), _ks_row("w", 0.01, 0.07, 0.1)]
    assert ui8._ks_gradients_fail(context(ui8_table1=paper_like)).verdict == REPRODUCED
    v = ui8._ks_gradients_fail(context(ui8_table1=student_fits))
    assert v.verdict == NOT_REPRODUCED and "gradient is not rejected" in v.reason


def test_figure_claims_read_the_plotted_data():
    its = range(10)
    error = [
        dict(panel="a", run=r, iteration=i, E=e * (1 + i))
        for i in its
        for r, e in (("GQ", 2.0), ("OursGVQ", 1.0))
    ]
    fits = [
        dict(panel="b", fit=f, iteration=i, D_n=d)
        for i in its
        for f, d in (("Gaussian", 0.2), ("Inverted-T", 0.3))
    ]
    ctx = context(daiq_figure3=error + fits)
    assert daiq._gvq_lower_error(ctx).verdict == REPRODUCED
    assert daiq._inverted_t_fits_at_times(ctx).verdict == NOT_REPRODUCED  # Gaussian closer every time
    curves = [
        dict(run=r, val_top1=v) for r, v in (("8-bit QE2 (e2=shift8)", 11.0), ("Flag QE2 (wageubn)", 90.0))
    ]
    assert wageubn._plain_qe2_fails(context(wageubn_figure9=curves)).verdict == REPRODUCED
    curves[0]["val_top1"] = 89.0  # trains: within a run's noise of Flag's is no failure
    assert wageubn._plain_qe2_fails(context(wageubn_figure9=curves)).verdict == NOT_REPRODUCED

    def forms(exponential, linear, quadratic):
        runs = (("exponential", exponential), ("linear", linear), ("quadratic", quadratic))
        return context(ui8_figure6=[dict(run=f"{f} scaling", val_top1=v) for f, v in runs])

    assert ui8._weaker_forms_crash(forms(80.0, 12.0, math.nan)).verdict == REPRODUCED
    v = ui8._weaker_forms_crash(forms(80.0, 70.0, 79.0))  # lower, but no crash: nothing to prevent
    assert v.verdict == INCONCLUSIVE and "no crash" in v.reason
    v = ui8._weaker_forms_crash(forms(80.0, 11.0, 79.0))
    assert v.verdict == NOT_REPRODUCED and v.reason.startswith("quadratic scaling trained")
    assert ui8._weaker_forms_crash(forms(10.0, 10.0, 10.0)).verdict == NOT_REPRODUCED


def test_phi_scaling_against_fixed_rates_reads_the_seeded_pairs():
    def figure(*pairs):
        finals = [
            dict(panel="b-final", run=f"eta{i}", seed=s, val_top1=80.0 + s) for i in (1, 2) for s in (0, 1, 2)
        ]
        paired = [
            dict(panel="b-paired", run=run, seeds=3, delta=d, half_width=h, spread=0.5, test_se=0.2)
            for run, d, h in pairs
        ]  # fmt: skip
        return context(ui8_figure4=finals + paired)

    assert (
        ui8._phi_scaling_beats_fixed_rates(figure(("eta2", 3.0, 1.0), ("eta4", 2.0, 1.0))).verdict
        == REPRODUCED
    )
    v = ui8._phi_scaling_beats_fixed_rates(figure(("eta2", 3.0, 1.0), ("eta3", -2.0, 1.0)))
    assert v.verdict == NOT_REPRODUCED and v.reason.endswith("below eta3")
    v = ui8._phi_scaling_beats_fixed_rates(figure(("eta2", 3.0, 1.0), ("eta4", -0.2, 1.0)))
    assert (
        v.verdict == INCONCLUSIVE
        and "seeds would settle it" in v.reason
        and "eta1 81.00 ± 1.00 (n=3)" in v.measurement
    )
    # a comparison without an interval (its runs diverged) is never counted as settled
    v = ui8._phi_scaling_beats_fixed_rates(figure(("eta2", 3.0, 1.0), ("eta4", math.nan, math.nan)))
    assert v.verdict == INCONCLUSIVE and "eta4 n/a" in v.measurement and "no interval for eta4" in v.reason
    # one run per setting (no seeded pairs): a direction, never a verdict
    one = [
        dict(panel="b", run=r, iteration=10, val_top1=t)
        for r, t in (("eta1: with phi", 80.0), ("eta4: no scaling", 79.0))
    ]
    v = ui8._phi_scaling_beats_fixed_rates(context(ui8_figure4=one))
    assert v.verdict == INCONCLUSIVE and "one run per curve" in v.reason


def test_a_period_that_cannot_be_shown_to_lose_under_a_point_is_inconclusive():
    speed = [dict(period=p, s_per_iter=t, device="cpu") for p, t in ((1, 10.0), (100, 2.0), (1000, 1.9))]
    tight = [_row("Period 1", int8=60.0, std=0.2, n=3), _row("Period 100", int8=59.8, std=0.2, n=3)]
    noisy = [_row("Period 1", int8=60.0, std=8.0), _row("Period 100", int8=60.5, std=4.0)]
    assert ui8._period_costs_little(context(ui8_table5=tight, ui8_table2=speed)).verdict == REPRODUCED
    # the same seeds on a 1,000-image test set: its binomial error (1.5 points a side) hides the answer
    small_test = [dict(r, int8_test_se=1.5) for r in tight]
    v = ui8._period_costs_little(context(ui8_table5=small_test, ui8_table2=speed))
    assert v.verdict == INCONCLUSIVE
    v = ui8._period_costs_little(context(ui8_table5=noisy, ui8_table2=speed))
    assert v.verdict == INCONCLUSIVE and "spread is wider" in v.reason


def test_within_a_point_reads_the_whole_interval():
    assert intervals.within_a_point(-0.2, 0.5) == "inside"
    assert intervals.within_a_point(-0.7, 0.5) == "straddles"  # [-1.2, -0.2]
    assert intervals.within_a_point(-1.6, 0.5) == "outside"
    assert intervals.within_a_point(1.6, 0.5) == "outside"  # a gain beyond a point is outside the claim too
    assert intervals.within_a_point(-0.2, None) == "unknown"


@pytest.mark.parametrize(
    "half, n, verdict",
    [(0.4, 3, REPRODUCED), (0.9, 3, INCONCLUSIVE), (None, 1, INCONCLUSIVE)],
)
def test_close_to_fp32_verdict_follows_the_intervals(half, n, verdict):
    rows = [
        _row("Ours", method="daiq", int8=None, delta=-0.3, delta_std=None, n_fp32=n, n=n, delta_ci95=half)
    ]
    frames = {name.replace("-", "_"): rows for name in claims.CLOSE_TO_FP32_TABLES}
    v = close_to_fp32._close_to_fp32(context(**frames))
    assert v.verdict == verdict, v
    outside = [_row("Ours", method="ui8", int8=None, delta=-2.0, n_fp32=3, n=3, delta_ci95=0.5)]
    frames = {name.replace("-", "_"): rows + outside for name in claims.CLOSE_TO_FP32_TABLES}
    v = close_to_fp32._close_to_fp32(context(**frames))
    assert v.verdict == NOT_REPRODUCED and "1 lose more than a point" in v.reason
    above = [_row("Ours", method="ui8", int8=None, delta=+2.0, n_fp32=3, n=3, delta_ci95=0.5)]
    frames = {name.replace("-", "_"): rows + above for name in claims.CLOSE_TO_FP32_TABLES}
    v = close_to_fp32._close_to_fp32(context(**frames))
    assert v.verdict == NOT_REPRODUCED and "above FP32" in v.reason and "lose" not in v.reason


def test_tables_kept_without_an_interval_get_the_seeds_share():
    r = pd.Series(dict(delta_std=0.3, n_int8=3, n_fp32=3))
    assert intervals.half_width(r) == pytest.approx(4.302653 * 0.3 / 3**0.5, rel=1e-5)
    assert intervals.half_width(pd.Series(dict(delta_std=0.3, n_int8=1, n_fp32=3))) is None


def test_an_inconclusive_verdict_says_how_many_seeds_would_settle_it():
    # GQ and MCS 0.3 apart in every seed but one, where they are 0.3 the other way: paired, the interval
    # holds zero; at that mean and spread, the projection names a finite count
    rows = [_row(label, method, 90.0, 1.0, 3) for label, method in
            (("GQ", "gq"), ("GVQ", "daiq-gvq"), ("MCS", "daiq-mcs"), ("both", "daiq"))]  # fmt: skip
    seeds = {0: [89.0, 90.0, 91.0]} | {r: [89.3, 90.3, 90.7] for r in (1, 2, 3)}
    ctx = context(table2=rows)
    ctx.run_frames["table2"] = _runs(seeds)
    v = daiq._daiq_ablations_beat_gq(ctx)
    assert v.verdict == INCONCLUSIVE and "seeds would settle it" in v.reason, v.reason
    c = claims.compare_rows(ctx, "table2", ctx.frames["table2"].iloc[1], ctx.frames["table2"].iloc[0])
    assert c.seeds == 3 and c.spread == pytest.approx(0.3464, abs=1e-3) and 3 < c.seeds_to_settle() < 100
    assert f"{c.seeds_to_settle()} seeds" in v.reason
    # without the runs there is no spread of paired differences to project from: no count
    v = daiq._daiq_ablations_beat_gq(context(table2=rows))
    assert v.verdict == INCONCLUSIVE and "seeds would" not in v.reason
    # the central claim: a row on the edge of a point cannot be settled by any count here
    edge = [_row("Ours", method="daiq", int8=None, delta=-1.0, delta_std=0.5, n_fp32=3, n=3, delta_ci95=1.2)]
    frames = {name.replace("-", "_"): edge for name in claims.CLOSE_TO_FP32_TABLES}
    v = close_to_fp32._close_to_fp32(context(**frames))
    assert v.verdict == INCONCLUSIVE and f"more than {verdict.MOST_SEEDS} seeds" in v.reason


def test_the_central_claim_reads_out_the_mean_over_a_tables_models():
    # three models' deltas -0.5, -0.2, +0.1: mean -0.2, half-width t(0.975, 2) * 0.3 / sqrt(3)
    mean, half = claims.mean_over_models([-0.5, -0.2, 0.1])
    assert mean == pytest.approx(-0.2) and half == pytest.approx(4.302653 * 0.3 / 3**0.5, rel=1e-5)
    assert claims.mean_over_models([-0.5, 0.1]) is None  # two models: no spread worth a t interval
    rows = [
        _row("Ours", model=m, method="daiq", int8=None, delta=d, delta_std=0.5, n_fp32=3, n=3, delta_ci95=1.5)
        for m, d in (("a", -0.5), ("b", -0.2), ("c", 0.1))
    ]
    every = {name.replace("-", "_"): rows for name in claims.CLOSE_TO_FP32_TABLES}
    v = close_to_fp32._close_to_fp32(context(**every))
    assert v.verdict == INCONCLUSIVE  # every row straddles: the mean does not settle "every model"
    # the tables share these cells (as DAIQ Table 3 and UI8 Table 6 do): the first table counts them
    assert "table3 daiq over 3 models -0.20 [-0.95, +0.55]" in v.measurement, v.measurement
    assert v.measurement.count("over 3 models") == 1
    two = {name.replace("-", "_"): rows[:2] for name in claims.CLOSE_TO_FP32_TABLES}
    v = close_to_fp32._close_to_fp32(context(**two))
    assert "over 2 models" not in v.measurement and "Mean over" not in v.measurement


KEPT = Path(__file__).resolve().parents[1] / "results" / "reference" / "embedded"


def test_the_kept_report_is_what_todays_code_reads_from_the_kept_tables():
    """The kept claims.csv is the oracle: the code's verdicts, key numbers, measurements, reasons and
    commands on the kept tables and figures. A change of rule or wording regenerates the kept report
    (`make claims KEPT=results/reference/embedded RESULTS=results/reference/embedded`)."""
    kept = pd.read_csv(KEPT / "claims.csv", keep_default_na=False)
    ctx = Context(profile="embedded", results_dir=Path("unused"), progress=False, kept=KEPT)
    now = claims.evaluate(ctx).astype(str)
    columns = ["key", "source", "verdict", "key_number", "measurement", "reason", "commands"]
    assert now[columns].to_dict("records") == kept[columns].astype(str).to_dict("records")
    # and the kept file is today's shape (a column added to the report regenerates it)
    assert list(kept.columns) == list(now.columns)
    rest = ["paper", "claim", "profile", "failed_cells"]
    assert now[rest].to_dict("records") == kept[rest].astype(str).to_dict("records")


def test_the_report_is_compact_on_top_with_pastable_commands_below(tmp_path):
    ctx = Context(profile="embedded", results_dir=tmp_path, progress=False, kept=KEPT)
    frame, paths = claims.write(ctx)
    top, details = paths["md"].read_text().split("## Details", 1)
    rows = [line for line in top.splitlines() if line.startswith("| [")]
    assert len(rows) == len(claims.CLAIMS)
    for line in rows:  # claim, source, verdict, key number, reason: each short
        assert all(len(c) < 200 for c in line.split(" | ")), line
    assert "| DAIQ Table 7; UI8 Table 10 |" in top and "DAIQ / UI8 DAIQ" not in top
    commands = [line.strip() for line in details.splitlines() if line.startswith("    ")]
    assert commands and all(
        re.fullmatch(r"make [a-z0-9-]+ PROFILE=embedded( COMPILE=1)?", c) for c in commands
    )
    assert "make table7 PROFILE=embedded COMPILE=1" in commands
    assert details.count("\n### ") == len(claims.CLAIMS)


def test_every_claim_is_in_the_reports_order_once():
    keys = [c.key for m in (ui8, daiq, wageubn, speed, close_to_fp32) for c in m.CLAIMS]
    assert sorted(keys) == sorted(registry.ORDER) and len(set(keys)) == len(keys)


def test_no_module_of_the_claims_package_runs_over_400_lines():
    package = Path(claims.__file__).parent
    assert {p.name: n for p in package.glob("*.py") if (n := len(p.read_text().splitlines())) > 400} == {}


def test_make_claims_on_the_kept_folder_reads_its_kept_tables():
    """`make claims RESULTS=results/reference/embedded` (docs/tables.md) reads the kept tables there, as
    KEPT= does: without --kept the report generates the tables it lacks, which trained cells into the kept
    folder."""
    root = Path(__file__).resolve().parents[1]

    def dry(*args):
        cmd = ["make", "-n", "claims", *args]
        return subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)

    assert "--kept results/reference/embedded" in dry("RESULTS=results/reference/embedded").stdout
    assert "--kept" not in dry("RESULTS=/tmp/some-results").stdout
    assert "--kept /tmp/kept" in dry("RESULTS=results/reference/embedded", "KEPT=/tmp/kept").stdout
