"""Out of memory ends a run with one line naming the batch size and the peak memory: a failure, not a
divergence, and a table goes on with its next cell. Injected (no test exhausts memory): a training step
raises what torch raises."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tables.command import main
from tables.generate import generate
from tables.specs import SPECS
from tasks import classification, top1
from tasks import out_of_memory as oom
from tasks.out_of_memory import RunFailed, is_out_of_memory, out_of_memory_line

CUDA_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
HOST_OOM = RuntimeError(
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 35184372088832 bytes. Error code 12 (Cannot allocate memory)"
)


def _inject(monkeypatch, error: BaseException, at_call: int = 2, method: str | None = None) -> None:
    """The classifier's training forward raises `error` at its at_call-th call (of `method`'s runs)."""
    real = top1.CrossEntropyClassifier.forward
    calls = {"n": 0}

    def forward(self, inputs, labels=None, mode="tensor"):
        layer = next((m for m in self.net.modules() if hasattr(m, "int8")), None)
        if mode == "loss" and (method is None or layer.int8.method.name == method):
            calls["n"] += 1
            if calls["n"] == at_call:
                raise error
        return real(self, inputs, labels, mode)

    monkeypatch.setattr(top1.CrossEntropyClassifier, "forward", forward)


def test_out_of_memory_is_recognised_by_torchs_types_and_messages():
    assert is_out_of_memory(CUDA_OOM) and is_out_of_memory(HOST_OOM) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shapes cannot be multiplied")) and not is_out_of_memory(
        KeyError()
    )


def test_a_gpus_line_names_its_peak_and_total(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 70.5 * 2**30)
    props = type("Props", (), {"total_memory": 80 * 2**30})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    line = out_of_memory_line(CUDA_OOM, "in training iteration 7", 256, torch.device("cuda", 0))
    assert line == (
        "out of memory on the GPU in training iteration 7 with batch size 256 per rank (peak 70.5 GiB "
        "allocated of 80.0 GiB on cuda:0): lower the batch size (--cfg-options "
        "train_dataloader.batch_size=N) or use a device with more memory"
    )


@pytest.mark.parametrize("error", [CUDA_OOM, HOST_OOM], ids=["torch.OutOfMemoryError", "host allocator"])
def test_a_run_out_of_memory_fails_with_one_line_and_is_not_a_divergence(monkeypatch, error):
    _inject(monkeypatch, error)
    with pytest.raises(RunFailed) as failed:
        classification.run("resnet18", "daiq", profile="smoke")
    line = str(failed.value)
    assert "\n" not in line and line.startswith(
        "out of memory on the host in training iteration 2 with batch "
    )
    assert "batch size 8 per rank (peak " in line and " GiB resident of " in line


def test_repro_train_out_of_memory_is_one_line_and_exit_1(monkeypatch, capsys):
    _inject(monkeypatch, HOST_OOM)
    monkeypatch.setattr(oom, "peak_memory", lambda device: "peak 1.5 GiB resident of 8.0 GiB host memory")
    assert main(["train", "--model", "resnet18", "--method", "fp32", "--profile", "smoke"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: out of memory on the host in training iteration 2 with batch size 8 per rank (peak 1.5 "
        "GiB resident of 8.0 GiB host memory): lower the batch size (--cfg-options "
        "train_dataloader.batch_size=N) or use a device with more memory"
    )


def test_a_table_records_the_cell_as_failed_and_goes_on(tmp_path, monkeypatch):
    _inject(monkeypatch, CUDA_OOM, method="fp32")  # the FP32 baseline runs first, then the INT8 cell
    spec = SPECS["table4"]
    spec = dataclasses.replace(
        spec, rows=tuple(r for r in spec.rows if (r.model, r.method) == ("resnet18", "daiq"))
    )
    out = generate(spec, profile="smoke", results_dir=tmp_path, progress=False)
    assert out.errors == 1 and out.ran == 2
    (error,) = [o.error for o in out.outcomes.values() if o.error]
    assert error.startswith("RunFailed: out of memory on the host in training iteration 2 with batch size 8")
    (ok,) = [o.result for o in out.outcomes.values() if o.result]
    assert ok["method"] == "daiq" and not ok["diverged"] and ok["top1"] is not None
    assert out.frame["status"].tolist() == [f"error: FP32 baseline: {error}"]  # failed, not diverged
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1  # the failed cell is not cached
