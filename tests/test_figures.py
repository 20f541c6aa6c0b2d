"""Figures drawn from measured data: DAIQ Figure 4 from a kernel benchmark JSON."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PIL import Image

from tables.figures import daiq_figure4


def _bench_json(path, kind="cuda"):
    """A pytest-benchmark JSON of the shape tests/bench writes: two conv layers and the fc layer."""
    half = "fp16" if kind == "cuda" else "bf16"
    benchmarks = []
    for layer, count in (("64-56-64-1-1", 1), ("64-56-64-3-1", 3), ("fc 2048-1000", 1)):
        for op in ("fwd", "dx", "dw"):
            for impl, ms in (("int8", 2.0), ("int8-op", 1.0), ("fp32", 8.0), (half, 3.0)):
                info = dict(layer=layer, count=count, op=op, impl=impl, batch=64, device="NVIDIA Test GPU",
                            device_kind=kind, half=half, threads=1, load=0.1)  # fmt: skip
                benchmarks.append({"extra_info": info, "stats": {"min": ms / 1e3, "median": ms / 1e3}})
    path.write_text(json.dumps({"benchmarks": benchmarks, "datetime": "now", "machine_info": {}}))
    return path


@pytest.mark.parametrize("kind", ["cuda", "cpu"])
def test_daiq_figure4_draws_int8_over_half_per_convolution(tmp_path, kind):
    png, csv_path = daiq_figure4.draw(_bench_json(tmp_path / "b.json", kind), tmp_path / "out")
    assert png.stat().st_size > 10_000
    with Image.open(png) as image:  # a real image with something drawn on it, not a blank canvas
        pixels = np.asarray(image.convert("L"), dtype=np.float64)
    assert min(pixels.shape) >= 300 and pixels.std() > 10 and (pixels < 128).mean() > 0.005
    rows = list(csv.DictReader(csv_path.open()))
    assert {r["layer"] for r in rows} == {"64-56-64-1-1", "64-56-64-3-1"}  # convolutions only
    assert len(rows) == 6
    for r in rows:
        assert float(r["speedup_int8"]) == pytest.approx(1.5) and float(
            r["speedup_int8_op"]
        ) == pytest.approx(3.0)


def test_daiq_figure4_command_needs_the_benchmark(tmp_path, capsys):
    assert daiq_figure4.main([str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2
    assert "make bench" in capsys.readouterr().err
