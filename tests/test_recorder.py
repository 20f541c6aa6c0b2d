"""The statistics recorder (repro.recorder) and its MMEngine hook: it changes no gradient (a run with it
equals a run without, bit for bit), costs nothing between recorded iterations, records what each method
quantized, and keeps its samples bounded."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
import torchvision
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

import repro
from repro import stats
from repro.hooks import StatsRecorderHook, spread
from repro.layers import layer_quantizers
from repro.recorder import StatsRecorder, load

METHODS = ("fp32", "ui8", "daiq", "wageubn")
LAYERS = ["layer1.0.conv1", "layer2.0.conv2", "layer3.0.bn1", "layer3.0.relu", "layer3.0.conv2"]
PATHS = ("A", "W", "G", "GW", "BN", "E1")


def _model():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def _train(method: str, recorder_args: dict | None, steps: int = 3):
    """A few SGD steps of a quantized ResNet-18 on a fixed batch (stochastic rounding throughout)."""
    model = _model()
    repro.quantize_model(model, method)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    built = model.layer1[0].conv1.int8.method
    optimizer = built.make_optimizer(model, optimizer) or optimizer
    repro.LayerLrScaling(model, optimizer)
    recorder = None if recorder_args is None else StatsRecorder(model, **recorder_args)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    for it in range(steps):
        built.set_progress(it, steps)
        with recorder.iteration(it) if recorder else contextlib.nullcontext():
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
        optimizer.step()
    return model, recorder


@pytest.mark.parametrize("method", METHODS)
def test_a_run_with_the_recorder_equals_a_run_without(method):
    everything = dict(
        layers=LAYERS,  # every kind of probe: int8 or simulated convolutions, WAGEUBN's BN and ReLU
        paths=PATHS,
        every=1,
        ks=True,
        dn=True,
        slices=3,
        clip_curve=True,
        compare=("int8", "shift8", "flag8"),
        sample_size=64,
    )
    plain, _ = _train(method, None)
    recorded, recorder = _train(method, everything)
    for (name, a), b in zip(plain.state_dict().items(), recorded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert len(recorder.records) > 0


@pytest.mark.parametrize("method", METHODS)
def test_records_hold_what_the_layer_quantized(method):
    args = dict(layers=LAYERS, paths=PATHS, iterations=[1], sample_size=100, dn=True)
    _, rec = _train(method, args)
    assert {r["iteration"] for r in rec.records} == {1}
    g = [r for r in rec.records if r["path"] == "G" and r["layer"] == "layer2.0.conv2"][0]
    assert (
        g["n"] == 8 * 128 * 2 * 2
        and g["sample"]["n"] <= 100
        and g["sample"]["how"] == "uniform random subsample"
    )
    assert 0 < g["absmax"] and sum(g["hist"]) == g["n"] and "dn" in g
    paths = {(r["layer"], r["path"]) for r in rec.records}
    if method == "fp32":
        assert "quant" not in g and ("layer2.0.conv2", "GW") in paths
        return
    assert 0 <= g["quant"]["d_c"] < 0.5 and g["quant"]["E"] >= 0
    if method == "daiq":  # GVQ: the weight-gradient path has its own per-channel codes
        assert "quant_gw" in g and g["quant_gw"]["d_c"] <= g["quant"]["d_c"] + 0.05
    if method == "ui8":
        assert g["method"]["clip"] > 0 and 0 < g["method"]["lr_scale"] <= 1
    if method == "wageubn":  # the simulated layer's E2, weight gradient, and the swapped BN and ReLU
        swapped = {("layer3.0.bn1", "BN"), ("layer3.0.relu", "A"), ("layer3.0.relu", "E1")}
        assert swapped | {("layer2.0.conv2", "GW"), ("layer2.0.conv2", "W")} <= paths
        relu = [r for r in rec.records if r["path"] == "A" and r["layer"] == "layer3.0.relu"]
        assert len(relu) == 2 and {r["call"] for r in relu} == {0, 1}  # the block's ReLU runs twice
        w = [r for r in rec.records if r["path"] == "W" and r["layer"] == "layer2.0.conv2"][0]
        assert 0 < w["quant"]["d_c"] < 1e-2  # QW: 8-bit fixed-point weights (step 2^-7)
    x = rec.samples[f"{g['sample']['key']}|float"]
    assert x.shape[0] == g["sample"]["n"] and rec.samples[f"{g['sample']['key']}|quant"].shape == x.shape


def test_int8_gradient_record_matches_the_codes():
    """d_c and E of a UI8 layer's record are those of the gradient and the dequantized codes it trained on."""
    model = _model()
    repro.quantize_model(model, "gq")
    layer = model.layer2[0].conv2
    seen = {}
    quantizer = layer.int8
    original = type(quantizer).grad

    def spy(self, g, channel_axis):
        codes = original(self, g, channel_axis)
        if self is quantizer:  # the class's method: every other layer calls it too
            seen["g"], seen["g_hat"] = g.clone(), repro.dequantize(codes.gx, codes.gx_scale)
        return codes

    type(quantizer).grad = spy
    try:
        recorder = StatsRecorder(model, layers=["layer2.0.conv2"], paths=("G",), iterations=[0])
        with recorder.iteration(0):
            F.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.randint(0, 10, (4,))).backward()
    finally:
        type(quantizer).grad = original
    (rec,) = recorder.records
    assert rec["quant"]["d_c"] == pytest.approx(stats.cosine_distance(seen["g"], seen["g_hat"]), rel=1e-12)
    assert rec["quant"]["E"] == pytest.approx(stats.daiq_error(seen["g"], seen["g_hat"]), rel=1e-12)


def test_nothing_is_installed_between_recorded_iterations():
    model = _model()
    repro.quantize_model(model, "ui8")
    recorder = StatsRecorder(model, layers=["layer1.0.conv1"], iterations=[1])
    conv = model.layer1[0].conv1
    quantizer = layer_quantizers(conv)[0]
    with recorder.iteration(0):
        assert not conv._forward_hooks and "grad" not in vars(quantizer)
    with recorder.iteration(1):
        assert "grad" in vars(quantizer) and "activation" in vars(quantizer)
    assert "grad" not in vars(quantizer) and not conv._forward_hooks and not recorder.records  # nothing ran


def test_bad_arguments_are_one_line_errors():
    model = _model()
    with pytest.raises(ValueError, match="unknown path 'X'"):
        StatsRecorder(model, paths=("X",), every=1)
    with pytest.raises(ValueError, match="names no module"):
        StatsRecorder(model, layers=["nope"], every=1)
    with pytest.raises(ValueError, match="say when"):
        StatsRecorder(model)
    with pytest.raises(ValueError, match="unknown comparison"):
        StatsRecorder(model, every=1, compare=("int4",))


def test_save_and_load(tmp_path):
    _, rec = _train("daiq", dict(layers=["layer2.0.conv2"], paths=("G",), every=2, sample_size=50))
    rec.save(tmp_path, extra={"curves": {"loss": [1.0]}})
    body, samples = load(tmp_path)
    assert body["curves"] == {"loss": [1.0]} and len(body["records"]) == len(rec.records) == 2
    assert body["config"]["sampling"].startswith("a uniform random subsample")
    assert set(samples) == set(rec.samples)


def test_spread_covers_both_ends():
    assert spread(3, 10) == [0, 4, 9] and spread(1, 10) == [0] and spread(0, 10) == []
    assert spread(20, 5) == [0, 1, 2, 3, 4]


@pytest.fixture
def data_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("REPRO_DATA_CACHE", str(tmp_path_factory.getbasetemp() / "repro-data-cache"))


KEPT: dict[str, dict] = {}


@HOOKS.register_module(name="ReproKeepWeights", force=True)
class KeepWeights(Hook):
    """Keeps a run's trained weights in KEPT (the runner is gone when the task's run() returns)."""

    def __init__(self, key: str):
        self.key = key

    def after_train(self, runner) -> None:
        KEPT[self.key] = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


def test_the_hook_changes_nothing_in_a_training_run(tmp_path, data_cache):
    """A smoke training with the hook (records, curves, evaluations between iterations) ends bit for bit
    where the same training without it ends, and writes its records."""
    from tasks import classification

    hook = dict(
        type="StatsRecorderHook",
        out=str(tmp_path / "stats"),
        times=3,
        eval_times=2,
        layers=None,
        paths=["G"],
        sample_size=32,
    )
    results = {}
    for kind, extra in (("plain", {}), ("recorded", {"stats": hook})):
        hooks = {**extra, "keep": dict(type="ReproKeepWeights", key=kind)}
        results[kind] = classification.run(
            "resnet18", "ui8", profile="smoke", cfg_options={"default_hooks": hooks}
        )
    assert results["plain"].final_loss == results["recorded"].final_loss
    assert results["plain"].top1 == results["recorded"].top1
    for name, value in KEPT["plain"].items():
        assert torch.equal(value, KEPT["recorded"][name]), name
    body, _ = load(tmp_path / "stats")
    curves = body["curves"]
    assert len(curves["loss"]) == results["recorded"].iters and len(curves["val"]) >= 2
    assert {r["iteration"] for r in body["records"]} == set(spread(3, results["recorded"].iters))


def test_the_hook_registers_under_its_name():
    assert HOOKS.get("StatsRecorderHook") is StatsRecorderHook
