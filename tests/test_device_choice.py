"""DEVICE= / --device for every table, figure and train command (issue 61: `make table4 DEVICE=cuda` on a
machine without CUDA trained on the CPU and exited 0)."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tables.command import main as repro_main
from tables.generate import generate
from tasks.device_choice import trained_on, use_device

ROOT = Path(__file__).resolve().parents[1]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU where there is none")


@no_gpu
@pytest.mark.parametrize(
    "argv",
    [
        ["table", "table2", "--profile", "smoke"],
        ["figure", "ui8-figure2", "--profile", "smoke"],
        ["train", "--model", "resnet20", "--method", "daiq", "--profile", "smoke"],
    ],
    ids=["table", "figure", "train"],
)
def test_cuda_where_there_is_no_gpu_is_one_line_and_exit_2(argv, tmp_path, capsys):
    where = ["--results-dir", str(tmp_path)] if argv[0] != "train" else ["--work-dir", str(tmp_path / "w")]
    assert repro_main([*argv, *where, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cuda" in err[0] and "no CUDA device" in err[0]
    assert not list(tmp_path.rglob("*.json"))  # nothing trained, nothing cached


def test_unknown_device_and_cpu_hides_the_gpus(monkeypatch):
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        use_device("tpu")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    use_device(None)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    if not torch.cuda.is_initialized():
        use_device("cpu")
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_make_passes_device_to_every_table_and_figure():
    for target in ("table4", "ui8-table3", "ui8-figure2", "table7"):
        dry = subprocess.run(
            ["make", "-n", target, "DEVICE=cuda"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        assert "--device cuda" in dry.stdout, target


def test_each_cell_records_its_device_and_the_footer_says_it(tmp_path):
    def runner(**kw):
        return dict(task="classification", model=kw["model"], method=kw["method"], top1=50.0, diverged=False,
                    final_loss=0.5, dataset="fake", epochs=1, iters=1, ms_per_iter=1.0, simulated=False,
                    seed=kw["seed"], profile="smoke", paper_dataset="imagenet")  # fmt: skip

    out = generate("table2", profile="smoke", seeds=1, results_dir=tmp_path, runner=runner, progress=False)
    entries = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*.json")]
    assert entries and {e["ran_with"]["device"] for e in entries} == {trained_on()}
    assert out.meta["trained_on"] == {trained_on(): len(entries)}
    assert f"Cells trained on {trained_on()}: {len(entries)}." in out.markdown


def test_a_cell_scored_from_its_twins_training_is_not_counted_as_trained_again():
    from tables.generate import Outcome
    from tables.render import _trained_on

    here = {"threads": 1, "jobs": 1, "device": "cpu (x)"}
    trained = Outcome(result={"top1": 1.0}, ran_with=here)
    twin = Outcome(result={"top1": 1.0}, ran_with=here, shared_from="abc")
    assert _trained_on([trained, twin]) == {"cpu (x)": 1}
