"""repro.step_audit: a training step through the CUDA backend's host code on the meta device (no GPU).

What a GPU run would otherwise be the first to show: a host read (.item(), bool(), tensor indexing) inside
a step, per-block Python loops that multiply launches with the tensor's size, and the bytes a step keeps.
"""

from __future__ import annotations

import torch

import kernels
from kernels import cuda, errors
from kernels.cuda import dry_run, runtime
from repro import step_audit, steptime
from repro.methods import daiq

SMALL = dict(model="resnet18", batch=2, size=32, num_classes=10)
# every INT8 method a user trains on a GPU with the speed tables' step, UI8 with its clip search in the
# audited step (period 1), with 2-bit weights and with clipping off
VARIANTS = [
    steptime.int8_variant("daiq"),
    steptime.int8_variant("ui8", period=1),
    steptime.int8_variant("ui8", period=1, bits_w=2),
    steptime.int8_variant("ui8", clip=False, period=1),
    steptime.int8_variant("gq"),
]


def test_no_host_reads_inside_a_step():
    """Only the non-finite flag is read, once per iteration (two steps: two reads)."""
    for variant in VARIANTS:
        audit = step_audit.audit_step(variant, **SMALL)
        assert audit.syncs == [], (variant.name, audit.syncs)
        assert len(audit.reads) == 2 and all(r.where.startswith("kernels/errors.py") for r in audit.reads)
        assert audit.kernel_launches > 0 and audit.launches["quantize_groups"] > 0


def test_a_host_read_is_caught_with_its_line(monkeypatch):
    update = daiq.mcs_update

    def reading(gmax, above, prev, k, A, lam):
        if float(gmax.max()) > 0:  # what a careless statistic does: waits for the GPU
            pass
        return update(gmax, above, prev, k, A, lam)

    monkeypatch.setattr(daiq, "mcs_update", reading)
    audit = step_audit.audit_step(steptime.int8_variant("daiq"), **SMALL)
    assert audit.syncs and {r.op for r in audit.syncs} == {"_local_scalar_dense"}
    assert all(r.where.startswith("tests/test_step_audit.py") for r in audit.syncs)
    assert "host read _local_scalar_dense at tests/test_step_audit.py" in step_audit.report({"daiq": audit})


def test_launches_do_not_grow_with_the_batch_or_the_image():
    """No Python loop over blocks or rows: the same ops and launches at any batch and size (with every
    GEMM past cuBLASLt's M > 16, so that none is padded, and small enough that no convolution is split
    into batch chunks), a few dozen per quantized layer."""
    for variant in VARIANTS[:2] + [steptime.Variant("fp32", "FP32")]:
        a = step_audit.audit_step(variant, **{**SMALL, "batch": 8, "size": 64})
        b = step_audit.audit_step(variant, **{**SMALL, "batch": 16, "size": 96})
        assert (a.ops, a.launches) == (b.ops, b.launches), variant.name
    fp32 = step_audit.audit_step(steptime.Variant("fp32", "FP32"), **SMALL)
    int8 = step_audit.audit_step(steptime.int8_variant("daiq"), **SMALL)
    layers = 19  # ResNet-18's convolutions and linear layer but the first and the last
    assert (int8.device_ops + int8.kernel_launches - fp32.device_ops) / layers < 64


def test_memory_estimate_counts_what_a_step_keeps():
    fp32 = step_audit.audit_step(steptime.Variant("fp32", "FP32"), **SMALL)
    double = step_audit.audit_step(steptime.Variant("fp32", "FP32"), **{**SMALL, "batch": 4})
    half = step_audit.audit_step(steptime.Variant("fp32", "FP32"), **SMALL, half=True)
    assert 0 < half.peak_bytes < fp32.peak_bytes < double.peak_bytes
    memory = step_audit._Memory()
    with step_audit._Counting(step_audit.StepAudit(), memory):
        a = torch.empty(1000, device="meta")  # 4000 bytes
        b = a.view(10, 100) * 2  # a view adds nothing, the product 4000
        del a, b
        torch.empty(250, dtype=torch.float64, device="meta")  # 2000, after both were freed
    assert (memory.peak, memory.live) == (8000, 0)


def test_copies_to_the_host_are_reads_copies_to_the_device_are_not():
    audit = step_audit.StepAudit()
    with step_audit._Counting(audit, step_audit._Memory()):
        x = torch.ones(3).to("meta")  # host to device: no wait
        x.copy_(torch.ones(3))
        host = x.to("cpu")  # device to host: waits (zeros here)
        torch.empty(3).copy_(x)
        bool(x.sum() > 0)
    assert [r.op for r in audit.reads] == ["_to_copy", "copy_", "_local_scalar_dense"]
    assert torch.equal(host, torch.zeros(3)) and not any(r.allowed for r in audit.reads)


def test_dry_run_restores_the_backend():
    launcher, get_backend = runtime.current(), kernels.get_backend
    with dry_run.dry_run() as launches:
        assert kernels.get_backend("meta") is cuda
        cuda.quantize(torch.empty(8, 4, device="meta"), 1.0)
        assert launches == {"quantize_groups": 1}
    assert runtime.current() is launcher and kernels.get_backend is get_backend
    errors.raise_if_nonfinite()  # the meta flag is gone: a later training would read it (and fail)
    errors.raise_if_nonfinite()


def test_cli_reports_and_rejects(capsys):
    assert step_audit.main(["fp32", "gq", "--model", "resnet18", "--batch", "2", "--size", "32"]) == 0
    out = capsys.readouterr().out
    assert "dry run of the CUDA backend" in out and "\ngq " in out and "GiB" in out
    assert step_audit.main(["fp16"]) == 2
    assert "no autocast" in capsys.readouterr().err
