"""The speed tables (DAIQ Table 7, UI8 Tables 10 and 2) at the smoke profile on the CPU: every row, the
paper's numbers as printed, phases that add up, the device named, and a killed timing run resumed."""

from __future__ import annotations

import json
import statistics

import pandas as pd
import pytest
import torch

from kernels.bench import devices
from tables import speed
from tables.cells import Cache
from tables.command import main as repro_main
from tables.specs import SPEED_SPECS, get_spec
from tables.speed import TimingCell, generate_speed, make_cell


@pytest.fixture(scope="module")
def table7(tmp_path_factory):
    out = tmp_path_factory.mktemp("speed")
    return out, generate_speed("table7", profile="smoke", device="cpu", results_dir=out, progress=False)


def test_specs_registered_with_the_papers_numbers():
    assert set(SPEED_SPECS) == {"table7", "ui8-table10", "ui8-table2"}
    t7 = {
        r.label: (r.paper_forward_ms, r.paper_backward_ms, r.paper_iteration_ms)
        for r in get_spec("table7").rows
    }
    assert t7["FP32"] == (71.1, 151.3, 237.8)
    assert t7["FP16"] == (38.3, 87.4, 136.4)
    assert t7["INT8 Ours (DAIQ)"] == (33.7, 72.6, 115.6)
    t10 = {
        r.label: (r.paper_forward_ms, r.paper_backward_ms, r.paper_iteration_ms)
        for r in get_spec("ui8-table10").rows
    }
    assert t10["FP32 (cuDNN)"] == pytest.approx((117.0, 221.0, 360.0))  # printed as 0.117 / 0.221 / 0.360 s
    assert t10["INT8 (ours)"] == pytest.approx((101.0, 171.0, 293.0))
    t2 = {r.period: r.paper_s_per_iter for r in get_spec("ui8-table2").rows}
    assert t2 == {1: 1.006, 10: 0.364, 100: 0.301, 1000: 0.297}


def test_table7_every_row_and_consistent_phases(table7):
    out, gen = table7
    frame = pd.read_csv(out / "table7.csv")
    assert list(frame.columns[:13]) == [
        "precision", "method", "label", "paper_forward_ms", "paper_backward_ms", "paper_iteration_ms",
        "forward_ms", "backward_ms", "iteration_ms", "peak_memory_mb", "iteration_vs_fp16",
        "iteration_vs_fp32", "forward_vs_fp16",
    ]  # fmt: skip
    assert set(["device", "batch", "size", "profile"]) <= set(frame.columns)
    assert list(frame["label"]) == [
        "FP32", "FP32 (TF32 tensor cores)", "FP16 (bf16)", "INT8 Ours (DAIQ)", "INT8 UI8", "INT8 GQ",
        "INT8 Ours (DAIQ) + 16-bit float layers (bf16)", "INT8 UI8 + 16-bit float layers (bf16)",
        "INT8 GQ + 16-bit float layers (bf16)",
    ]  # fmt: skip
    # the opt-in rows are the INT8 methods with their float layers under the FP16 row's autocast (bf16 here)
    assert list(frame["method"]) == [
        "fp32",
        "tf32",
        "bf16",
        "daiq",
        "ui8",
        "gq",
        "daiq+bf16",
        "ui8+bf16",
        "gq+bf16",
    ]
    assert frame["notes"][frame["method"].str.endswith("+bf16")].str.contains("opt-in").all()
    timed = frame[frame["method"] != "tf32"]  # TF32 is CUDA only
    assert frame.loc[frame["method"] == "tf32", "iteration_ms"].isna().all()
    assert (timed[["forward_ms", "backward_ms", "iteration_ms"]] > 0).all().all()
    assert (timed["forward_ms"] + timed["backward_ms"] <= timed["iteration_ms"]).all()
    assert timed["iteration_vs_fp32"][timed["method"] == "fp32"].tolist() == [1.0]
    assert (frame["profile"] == "smoke").all() and (frame["batch"] == 2).all() and (frame["size"] == 32).all()
    cpu = devices.cpu_model()
    assert (frame["device"].str.contains(cpu, regex=False)).all()
    assert cpu in gen.markdown and "bf16 autocast" in gen.markdown
    assert "| FP32 | FP32 | 71.1 | 151.3 | 237.8 |" in gen.markdown
    assert gen.meta["device"]["kind"] == "cpu" and gen.meta["device"]["threads"] >= 1


def test_ui8_table10_reuses_the_table7_run(table7, monkeypatch):
    from repro import heap

    out, gen7 = table7
    # `repro` (test_cli, in any order) turns on the reuse of freed memory for the rest of the process, and
    # a timing records it in its key: the table7 run reused here is the one made under the same setting
    monkeypatch.setattr(heap, "_applied", gen7.cell.malloc == "reuse")
    gen = generate_speed("ui8-table10", profile="smoke", device="cpu", results_dir=out, progress=False)
    assert gen.cached
    frame = gen.frame
    assert list(frame["label"]) == [
        "FP32 (cuDNN)", "FP16 (bf16)", "INT8 (ours)", "INT8 (ours) + 16-bit float layers (bf16)"
    ]  # fmt: skip
    assert frame["paper_iteration_ms"].tolist()[0] == pytest.approx(360.0)
    assert "printed in seconds, here in ms" in gen.markdown


def test_ui8_table2_periods(tmp_path):
    gen = generate_speed("ui8-table2", profile="smoke", device="cpu", results_dir=tmp_path, progress=False)
    frame = pd.read_csv(tmp_path / "ui8-table2.csv")
    assert list(frame.columns[:5]) == [
        "period",
        "paper_s_per_iter",
        "s_per_iter",
        "vs_period_1",
        "paper_vs_period_1",
    ]
    assert frame["period"].tolist() == [1, 10, 100, 1000]
    assert frame["paper_s_per_iter"].tolist() == [1.006, 0.364, 0.301, 0.297]
    # each period's s/iter is t_plain + (t_search - t_plain) / period within each measured round, the
    # median over rounds (structure, not speed: which variant was faster is the machine's business)
    samples = Cache(tmp_path / "cache").load(gen.cell)["result"]["samples"]
    search, plain = samples["search"]["iteration"], samples["plain"]["iteration"]
    assert len(search) == len(plain) == gen.cell.rounds
    for period, value in zip(frame["period"], frame["s_per_iter"], strict=True):
        want = statistics.median(p + (s - p) / period for s, p in zip(search, plain, strict=True))
        assert value == pytest.approx(want, rel=1e-9)
    assert "t_search" in gen.markdown and devices.cpu_model() in gen.markdown


def test_a_killed_timing_run_resumes_from_its_cache(tmp_path):
    class Killed(Exception):
        pass

    def kill_after_first_round(rounds_done, samples):
        if rounds_done == 1:
            raise Killed

    with pytest.raises(Killed):
        generate_speed("table7", profile="smoke", device="cpu", rounds=3, results_dir=tmp_path,
                       progress=False, on_round=kill_after_first_round)  # fmt: skip
    cell = make_cell(get_spec("table7"), "smoke", devices.resolve("cpu"), rounds=3)
    partial = tmp_path / "cache" / f"{cell.key}.partial.json"
    saved = json.loads(partial.read_text())
    assert all(len(s["iteration"]) == 1 for s in saved["samples"].values())

    seen = []
    gen = generate_speed("table7", profile="smoke", device="cpu", rounds=3, results_dir=tmp_path,
                         progress=False, on_round=lambda n, s: seen.append(n))  # fmt: skip
    assert seen == [2, 3]  # only the missing rounds ran
    entry = json.loads((tmp_path / "cache" / f"{cell.key}.json").read_text())
    assert entry["result"]["resumed_rounds"] == 1
    assert all(len(s["iteration"]) == 3 for s in entry["result"]["samples"].values())
    assert not partial.exists() and not gen.cached


def test_cells_differ_by_device_threads_and_code():
    spec = get_spec("table7")
    cpu = devices.resolve("cpu")
    a = make_cell(spec, "smoke", cpu)
    assert isinstance(a, TimingCell) and a.key == make_cell(spec, "smoke", cpu).key
    assert make_cell(spec, "smoke", cpu, batch=4).key != a.key
    cfg = a.config()
    assert cfg["device"]["threads"] >= 1 and cfg["sources"] and cfg["device"]["torch"]


def test_a_timing_says_whether_freed_memory_was_reused(monkeypatch):
    from repro import heap

    spec, cpu = get_spec("table7"), devices.resolve("cpu")
    monkeypatch.setattr(heap, "_applied", False)
    system = make_cell(spec, "smoke", cpu)
    monkeypatch.setattr(heap, "_applied", True)
    reused = make_cell(spec, "smoke", cpu)
    assert (system.malloc, reused.malloc) == ("system", "reuse") and system.key != reused.key

    def header(cell):
        return "\n".join(speed._header(spec, cell, cpu, ""))

    assert "kept for reuse" in header(reused) and "REPRO_MALLOC=system" in header(system)


def test_cli(tmp_path, capsys):
    args = ["table", "ui8-table10", "--profile", "smoke", "--device", "cpu", "--no-progress"]
    assert repro_main([*args, "--results-dir", str(tmp_path)]) == 0
    assert "FP32 (cuDNN)" in capsys.readouterr().out
    assert repro_main([*args, "--batch", "0", "--results-dir", str(tmp_path)]) == 2
    assert "--batch must be at least 1" in capsys.readouterr().err
    assert repro_main(["table", "table4", "--batch", "8", "--results-dir", str(tmp_path)]) == 2
    assert "speed tables only" in capsys.readouterr().err


def test_peak_step_memory_is_never_negative():
    """A step that frees more than it allocates needs nothing above what it started with: 0, not '-0'."""
    import types

    from repro import steptime

    held = [torch.ones(64 << 20, dtype=torch.uint8)]  # 64 MB resident before the step
    runner = types.SimpleNamespace(device=torch.device("cpu"), step=lambda x, y: held.clear())
    with steptime.cpu_memory_accounting():
        peak = steptime.peak_step_memory(runner, None, None)
    assert peak is None or peak >= 0


def test_peak_step_memory_counts_what_the_step_takes_from_freed_heap_memory():
    """Memory freed before the step stays resident in malloc's heap; a step that reuses it needs it all
    the same (the ResNet-50 bf16 rows read 0 MB before the heap was trimmed first)."""
    import types

    from repro import steptime

    def blocks():  # 2,000 x 16 KB, below any mmap threshold: heap chunks, touched by the fill
        return [torch.ones(16 << 10, dtype=torch.uint8) for _ in range(2000)]

    held = []
    runner = types.SimpleNamespace(device=torch.device("cpu"), step=lambda x, y: held.append(blocks()))
    with steptime.cpu_memory_accounting():
        freed = blocks()
        pinned = torch.ones(16 << 10, dtype=torch.uint8)  # a live chunk above them: no automatic trim
        del freed
        peak = steptime.peak_step_memory(runner, None, None)
    assert pinned.numel() and len(held) == 1
    if peak is not None:
        assert peak > 20, peak  # the step's 31 MB, not the resident set's growth alone


def _tiny_resnet(num_classes=1000):
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes),
    )  # fmt: skip


def test_a_compiled_step_time_table_adds_a_compiled_row_per_variant(tmp_path, monkeypatch):
    from repro import steptime

    monkeypatch.setitem(steptime.MODELS, "resnet50", _tiny_resnet)  # compiling ResNet-50 nine times: minutes
    torch._dynamo.reset()
    gen = generate_speed("table7", profile="smoke", device="cpu", results_dir=tmp_path, progress=False,
                         compiled=True)  # fmt: skip
    frame = gen.frame
    compiled = frame[frame["method"].str.endswith("+compile")]
    assert list(compiled["method"]) == [
        "fp32+compile",
        "bf16+compile",
        "daiq+compile",
        "ui8+compile",
        "gq+compile",
        "daiq+bf16+compile",
        "ui8+bf16+compile",
        "gq+bf16+compile",
    ]
    assert compiled["label"].str.endswith(", compiled").all() and compiled["paper_iteration_ms"].isna().all()
    assert (compiled["iteration_ms"] > 0).all()
    assert compiled.loc[compiled["method"] == "fp32+compile", "iteration_vs_fp32"].tolist() == [1.0]
    assert compiled.loc[compiled["method"] == "bf16+compile", "iteration_vs_fp16"].tolist() == [1.0]
    assert "FP32, compiled" in gen.markdown and "under torch.compile" in gen.markdown
    eager = make_cell(get_spec("table7"), "smoke", devices.resolve("cpu"))
    assert gen.cell.key != eager.key and eager.variants == [v for v in gen.cell.variants if not v.compiled]
    with pytest.raises(ValueError, match="step-time"):
        make_cell(get_spec("ui8-table2"), "smoke", devices.resolve("cpu"), compiled=True)


def test_step_time_cpu_time_reads_the_process_clock(monkeypatch, capsys):
    """repro step-time --cpu-time times every phase on time.process_time (a shared machine, one thread)."""
    import time

    from repro import steptime

    monkeypatch.setitem(steptime.MODELS, "resnet18", _tiny_resnet)
    ticks = iter(range(10**6))
    monkeypatch.setattr(time, "process_time", lambda: float(next(ticks)))
    assert repro_main(["step-time", "--methods", "fp32,gq", "--batch", "2", "--size", "8", "--rounds", "2",
                       "--cpu-time"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "CPU seconds of the process" in out
    # four clock reads a step, t3 - t0 = 3 ticks: 3000 ms a step
    assert out.count("3000.0") == 2, out
    with pytest.raises(ValueError, match="GPU"):
        steptime.time_steps("resnet18", ["fp32"], 1, 8, 1, cpu_time=True, device=torch.device("meta"))


def test_step_time_takes_an_int8_method_under_autocast(monkeypatch, capsys):
    """`--methods gq+bf16`: the INT8 method with its float layers under bf16 autocast, timed beside the
    others; an unknown method or 16-bit format is one line and exit 2."""
    from repro import steptime

    monkeypatch.setitem(steptime.MODELS, "resnet18", _tiny_resnet)
    seen = []
    real = steptime.time_variants

    def spy(variants, **kwargs):
        seen.extend((v.name, v.method, v.amp) for v in variants)
        return real(variants, **kwargs)

    monkeypatch.setattr(steptime, "time_variants", spy)
    assert repro_main(["step-time", "--methods", "bf16,gq+bf16", "--batch", "2", "--size", "8",
                       "--rounds", "1"]) == 0  # fmt: skip
    assert seen == [("bf16", None, "bfloat16"), ("gq+bf16", "gq", "bfloat16")]
    assert "gq+bf16" in capsys.readouterr().out
    for bad in ("gq+fp8", "nope+bf16", "fp32+bf16"):
        assert repro_main(["step-time", "--methods", bad]) == 2
        assert "unknown method" in capsys.readouterr().err
