"""`make gpu-report` (tables.gpu_report): every section end to end on the CPU at a tiny size, in a Python
that cannot import what a bare GPU machine lacks (mmengine, mmcv, mmdet, tqdm, pytest plugins); the
pieces that only a GPU run reaches (the targets, the tests' failures, keeping) on made-up inputs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tables import gpu_report

ROOT = Path(__file__).resolve().parent.parent
# what the GPU machine's python3 does not have (the issue lists what it has)
ABSENT = ("mmengine", "mmcv", "mmdet", "tqdm", "hypothesis", "pytest_benchmark", "pytest_randomly", "mutmut")


def bare_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python fails to import ABSENT (sitecustomize runs first in every process)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({ABSENT!r}))\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), OMP_NUM_THREADS="1")


def test_the_bare_python_really_lacks_them(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import mmengine"], env=bare_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode != 0 and "mmengine" in done.stderr


def test_tiny_cpu_report_has_every_section(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run(
        [sys.executable, "-m", "tables.gpu_report", "--device", "cpu", "--tiny", "--out", str(out)],
        cwd=ROOT, env=bare_env(tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    sections = report["sections"]
    assert set(sections) == set(gpu_report.SECTIONS)
    assert not [name for name, s in sections.items() if "failed" in s], sections
    assert report["machine"]["timings"].startswith("CPU timings")
    assert report["machine"]["commit"] and report["machine"]["environment_lock"]

    tests = sections["tests"]
    assert tests["exit_code"] == 0 and tests["counts"]["passed"] >= 1 and tests["first_failures"] == []

    variants = {v.name for v in gpu_report.step_variants(gpu_report.devices.resolve("cpu"), False)}
    assert {"fp32", "bf16", "gq", "daiq", "ui8", "gq+amp", "daiq+amp", "ui8+amp"} == variants
    for model in sections["steps"]["models"]:
        assert "failed" not in model, model
        assert {r["variant"] for r in model["rows"]} == variants
        for r in model["rows"]:
            assert 0 < r["ms"]["iteration"] < 60_000 and math.isfinite(r["vs_bf16"]) and r["vs_bf16"] > 0

    layers = sections["layers"]
    assert len(layers["layers"]) == len(gpu_report.RESNET50)
    for op in ("fwd", "dx", "dw"):
        assert set(layers["totals_ms"][op]) == {"int8-op", "int8", "fp32", "bf16"}
        assert all(v > 0 for v in layers["totals_ms"][op].values())

    profile = sections["profile"]
    assert profile["top"] and profile["top"][0]["ms_per_step"] > 0
    assert any("_int_mm" in r["name"] or "Int8" in r["name"] for r in profile["top"])

    md = (out / "report.md").read_text()
    for heading in ("## Tests", "## Steps", "## Layers", "## Profile", "CPU timings", "| daiq+amp |"):
        assert heading in md


def test_the_tests_section_reports_a_failure_in_full(tmp_path):
    test = tmp_path / "test_sample.py"
    test.write_text(
        textwrap.dedent(
            """
            import pytest

            def test_passes():
                assert True

            def test_fails():
                assert 1 + 1 == 3, "arithmetic is broken"

            @pytest.mark.skip(reason="not here")
            def test_skipped():
                pass
            """
        )
    )
    got = gpu_report.run_tests(str(test), timeout=120)
    assert got["counts"] == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1, "passed": 1}
    (failure,) = got["first_failures"]
    assert failure["test"].endswith("test_fails") and "arithmetic is broken" in failure["text"]
    assert [name.rsplit("::", 1)[1] for name in got["failed_tests"]] == ["test_fails"]
    md = "\n".join(gpu_report._md_tests(got))
    assert "1 passed, 1 failed" in md and "arithmetic is broken" in md and "Failed: `" in md


def test_tests_that_outlast_their_time_are_reported_not_fatal(tmp_path):
    test = tmp_path / "test_slow.py"
    test.write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    got = gpu_report.run_tests(str(test), timeout=8)
    assert got["exit_code"] is None and "counts" not in got
    assert "timed out after 8 s" in got["output_tail"]
    assert "timed out after 8 s" in "\n".join(gpu_report._md_tests(got))


def test_busy_time_is_the_union_of_overlapping_kernels():
    assert gpu_report.union_length([(20, 25), (0, 10), (5, 15), (6, 7)]) == 20
    assert gpu_report.union_length([]) == 0


def test_a_profile_without_device_kernels_still_renders():
    s = {"model": "resnet50", "method": "daiq", "batch": 64, "size": 224, "steps": 2, "unit": "GPU time",
         "launches_per_step": 0.0, "device_ops_per_step": 0.0, "window_ms_per_step": 0.0,
         "idle_ms_per_step": 0.0, "idle_share": None, "top": []}  # fmt: skip
    assert "Per step: 0 op calls." in "\n".join(gpu_report._md_profile(s))


def _row(variant, ms, vs_amp, vs_tf32, peak):
    return {
        "variant": variant,
        "ms": {"iteration": ms},
        "vs_fp16": vs_amp,
        "vs_tf32": vs_tf32,
        "peak_mb": peak,
    }


def test_targets_read_off_the_rows():
    rows = [_row("fp16", 24.0, 1.0, 0.6, 2800.0), _row("tf32", 38.0, 1.6, 1.0, 5000.0)]
    rows += [_row("gq", 30.0, 1.25, 0.79, 2500.0), _row("daiq", 45.0, 1.9, 1.18, 3000.0)]
    rows += [_row("ui8", 20.0, 0.83, 0.53, 2800.0)]
    mobile = [_row("fp16", 10.0, 1.0, 0.5, 1.0), _row("gq", 15.0, 1.5, 0.7, 1.0)]
    mobile += [_row("daiq", 25.0, 2.5, 1.2, 1.0), _row("ui8", 20.0, 2.0, 1.0, 1.0)]
    lines = gpu_report.step_targets(
        [
            {"model": "resnet50", "amp": "fp16", "rows": rows},
            {"model": "mobilenet_v2", "amp": "fp16", "rows": mobile},
        ]
    )
    text = "\n".join(lines)
    assert "ResNet-50 gq: 30.0 ms, 0.79x TF32's step (met: at most TF32), 1.25x AMP's (missed" in text
    assert "ResNet-50 daiq: 45.0 ms, 1.18x TF32's step (missed" in text
    assert "ResNet-50 ui8: 20.0 ms, 0.53x TF32's step (met: at most TF32), 0.83x AMP's (met" in text
    assert "ResNet-50 daiq peak memory 3000 MB against AMP's 2800 (missed" in text
    assert "ResNet-50 ui8 peak memory 2800 MB against AMP's 2800 (met" in text
    assert (
        "MobileNetV2 daiq: 2.50x AMP's step (missed" in text
        and "MobileNetV2 ui8: 2.00x AMP's step (met" in text
    )


def test_a_kept_report_is_never_overwritten(tmp_path):
    out, kept = tmp_path / "gpu", tmp_path / "kept"
    report = {
        "machine": {"device": {"name": "NVIDIA H100 80GB HBM3"}, "commit": "0123456789ab+dirty"},
        "tiny": False,
        "sections": {},
    }
    out.mkdir()
    for name in ("report.md", "report.json"):
        (out / name).write_text(name)
    paths = gpu_report.keep(report, out, kept)
    stem = "0123456789ab-dirty-nvidia-h100-80gb-hbm3"
    assert [p.name for p in paths] == [f"{stem}.md", f"{stem}.json"]
    with pytest.raises(FileExistsError):
        gpu_report.keep(report, out, kept)


def test_bad_arguments_are_one_line_and_exit_2(capsys):
    assert gpu_report.main(["--sections", "tests,speed", "--out", "/nonexistent"]) == 2
    assert gpu_report.main(["--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "unknown section 'speed'" in err[0] and "tpu" in err[1]


def test_a_report_made_in_parts_keeps_the_earlier_sections(tmp_path, monkeypatch):
    """A lent GPU runs 10 minutes a command: a second run on the same commit and device adds its sections to
    the first one's report; another commit starts afresh."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = str(tmp_path / "gpu")
    common = ["--device", "cpu", "--tiny", "--out", out, "--commit", "0123456789ab"]
    assert gpu_report.main([*common, "--sections", "layers"]) == 0
    assert gpu_report.main([*common, "--sections", "tests"]) == 0
    report = json.loads((tmp_path / "gpu" / "report.json").read_text())
    assert report["asked"] == ["tests", "layers"] and set(report["sections"]) == {"tests", "layers"}
    md = (tmp_path / "gpu" / "report.md").read_text()
    assert "## Tests" in md and "## Layers" in md
    common[-1] = "ba9876543210"
    assert gpu_report.main([*common, "--sections", "tests"]) == 0
    report = json.loads((tmp_path / "gpu" / "report.json").read_text())
    assert set(report["sections"]) == {"tests"}
