"""Quantized layers: forward and GX/GW equal the docs/methods.md formulas, computed here independently
(dequantized integer operands, float64 convolution), for every method and op family."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from repro import quantize_model
from repro.layers import Int8Layer
from repro.quant import absmax, dequantize, quantize

METHODS = ["gq", "ui8", "daiq", "daiq-gvq", "daiq-mcs"]
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
GRAD_INPUT = {1: torch.nn.grad.conv1d_input, 2: torch.nn.grad.conv2d_input, 3: torch.nn.grad.conv3d_input}
GRAD_WEIGHT = {1: torch.nn.grad.conv1d_weight, 2: torch.nn.grad.conv2d_weight, 3: torch.nn.grad.conv3d_weight}


def spy_on_codes(layer):
    """Record the GradCodes the method hands to the layer's backward."""
    seen = []
    grad = layer.int8.grad

    def recording(g, channel_axis):
        codes = grad(g, channel_axis)
        seen.append((g.detach().clone(), codes))
        return codes

    layer.int8.grad = recording
    return seen


def dequantized(t):
    return dequantize(quantize(t, absmax(t)), absmax(t)).double()


def check_codes_quantize_g(g, codes, axis):
    """Each code tensor is a stochastic rounding of clamp(G) at its scale: off by less than one step."""
    for q, s, ax in (
        (codes.gx, codes.gx_scale, None),
        (codes.gw, codes.gw_scale, axis if codes.gw_per_channel else None),
    ):
        shape = [1] * g.dim()
        if ax is not None:
            shape[ax] = -1
        s_b = s.reshape(shape) if ax is not None else s
        err = dequantize(q, s, axis=ax) - torch.maximum(torch.minimum(g, s_b), -s_b)
        assert (err.abs() <= s_b / 127 * (1 + 1e-5)).all()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "dims,kwargs",
    [
        (2, dict(stride=1, padding=1)),
        (2, dict(stride=2, padding=1, groups=2)),
        (2, dict(stride=1, padding=1, groups=8)),  # depthwise
        (1, dict(stride=2, padding=2, dilation=2)),
        (3, dict(stride=(1, 2, 2), padding=1)),
    ],
)
def test_conv_forward_and_gradients_follow_the_formulas(method, dims, kwargs):
    torch.manual_seed(0)
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims](8, 8, 3, bias=True, **kwargs)
    ref = {k: v.detach().clone() for k, v in conv.state_dict().items()}
    quantize_model(conv, method, skip=())
    assert isinstance(conv, Int8Layer)
    seen = spy_on_codes(conv)
    x = torch.randn(3, 8, *([9] * dims), requires_grad=True)
    y = conv(x)
    gy = torch.randn_like(y) * torch.rand(1, 8, *([1] * dims))  # channels of different magnitude
    y.backward(gy)

    geometry = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation, groups=conv.groups)
    xd, wd = dequantized(x.detach()), dequantized(ref["weight"])
    expected_y = CONV[dims](xd, wd, ref["bias"].double(), **geometry)
    torch.testing.assert_close(y.double(), expected_y, rtol=1e-5, atol=1e-5)

    ((g, codes),) = seen
    check_codes_quantize_g(g, codes, axis=1)
    gx_hat = dequantize(codes.gx, codes.gx_scale).double()
    gw_hat = dequantize(codes.gw, codes.gw_scale, axis=1 if codes.gw_per_channel else None).double()
    expected_gx = GRAD_INPUT[dims](x.shape, wd, gx_hat, **geometry)
    expected_gw = GRAD_WEIGHT[dims](xd, ref["weight"].shape, gw_hat, **geometry)
    torch.testing.assert_close(x.grad.double(), expected_gx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(conv.weight.grad.double(), expected_gw, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(conv.bias.grad, gy.sum(dim=[d for d in range(gy.dim()) if d != 1]))
    if method.startswith("daiq") and method != "daiq-mcs":
        assert codes.gw_per_channel and codes.gw_scale.shape == (8,)  # GVQ along output channels
    else:
        assert not codes.gw_per_channel


@pytest.mark.parametrize("method", METHODS)
def test_linear_forward_and_gradients_follow_the_formulas(method):
    torch.manual_seed(1)
    fc = nn.Linear(12, 5)
    w0, b0 = fc.weight.detach().clone(), fc.bias.detach().clone()
    quantize_model(fc, method, skip=())
    seen = spy_on_codes(fc)
    x = torch.randn(2, 4, 12, requires_grad=True)  # extra leading dims are flattened
    y = fc(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    xd, wd = dequantized(x.detach().reshape(-1, 12)), dequantized(w0)
    torch.testing.assert_close(y.double().reshape(-1, 5), xd @ wd.T + b0.double(), rtol=1e-5, atol=1e-5)
    ((g, codes),) = seen
    check_codes_quantize_g(g, codes, axis=1)
    gx_hat = dequantize(codes.gx, codes.gx_scale).double()
    gw_hat = dequantize(codes.gw, codes.gw_scale, axis=1 if codes.gw_per_channel else None).double()
    torch.testing.assert_close(x.grad.double().reshape(-1, 12), gx_hat @ wd, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fc.weight.grad.double(), gw_hat.T @ xd, rtol=1e-5, atol=1e-6)


def test_fp32_method_runs_the_float_op():
    torch.manual_seed(2)
    conv = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 7, 7)
    expected = conv(x)
    quantize_model(conv, "fp32", skip=())
    assert isinstance(conv, Int8Layer)
    torch.testing.assert_close(conv(x), expected)


def test_unsupported_padding_mode_stays_float_with_one_warning():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), nn.Conv2d(4, 4, 1)
    )
    with pytest.warns(UserWarning, match=r"'1' stays float: padding_mode='reflect'") as record:
        quantize_model(model, "daiq", skip=())
    assert len(record) == 1
    assert [isinstance(m, Int8Layer) for m in model] == [True, False, True]
    model(torch.randn(1, 3, 8, 8)).sum().backward()


def test_input_without_grad_skips_the_input_gradient(monkeypatch):
    from kernels import cpu

    calls, real = [], cpu.conv_input_grad
    monkeypatch.setattr(cpu, "conv_input_grad", lambda *a, **k: calls.append(1) or real(*a, **k))
    conv = quantize_model(nn.Conv2d(3, 4, 3), "daiq", skip=())
    x = torch.randn(2, 3, 6, 6)
    conv(x).sum().backward()
    assert conv.weight.grad is not None
    assert not calls, "the input gradient was computed for an input that needs none"
    conv(x.clone().requires_grad_()).sum().backward()
    assert len(calls) == 1


LAYOUTS = [
    (2, torch.contiguous_format),
    (2, torch.channels_last),
    (3, torch.contiguous_format),
    (3, torch.channels_last_3d),
]


@pytest.mark.parametrize("dims,layout", LAYOUTS)
def test_conv_output_and_input_gradient_take_the_input_layout(dims, layout):
    """As torch's convolution: the backends compute channels-last, but an NCHW input gets NCHW back (ops
    such as mmcv's RoIAlign read raw memory as NCHW); channels_last_out keeps the backend's layout."""
    torch.manual_seed(0)
    conv = getattr(nn, f"Conv{dims}d")(4, 6, 3, padding=1)
    shape = (2, 4, *([6] * dims))
    x = torch.randn(shape).contiguous(memory_format=layout).requires_grad_()
    results = {}
    for keep in (False, True):
        layer = quantize_model(copy.deepcopy(conv), "daiq", skip=(), channels_last_out=keep)
        x.grad = None
        y = layer(x)
        y.backward(torch.ones_like(y))  # deterministic codes: a constant G quantizes exactly
        results[keep] = (y.detach(), x.grad)
    cl = torch.channels_last if dims == 2 else torch.channels_last_3d
    y, gx = results[False]
    assert y.is_contiguous(memory_format=layout) and gx.is_contiguous(memory_format=layout)
    y_cl, gx_cl = results[True]
    assert y_cl.is_contiguous(memory_format=cl)  # (input gradients: as the backend's routes leave them)
    assert torch.equal(y, y_cl) and torch.equal(gx, gx_cl)  # the same numbers either way


def _small_net(device="cpu") -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10), nn.Linear(10, 5),
    ).to(device)  # fmt: skip


@pytest.mark.parametrize("method", ["gq", "daiq", "ui8"])
def test_int8_layers_take_and_return_the_autocast_dtype(method):
    """Under torch.autocast (bf16 on the CPU) the int8 layers return bf16, as torch's own convolutions
    would, so the rest of the network runs as a bf16 user's does; gradients keep the inputs' dtypes."""
    torch.manual_seed(0)
    model = quantize_model(_small_net(), method, skip=("first",))
    seen = {}

    def record(module, inputs, out):
        seen[module] = out.dtype

    for m in model.modules():
        if isinstance(m, Int8Layer):
            m.register_forward_hook(record)
    x = torch.randn(4, 3, 12, 12, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    assert seen and set(seen.values()) == {torch.bfloat16}
    assert x.grad is not None and x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
    # the same step without autocast stays float32 throughout
    seen.clear()
    model(x).sum().backward()
    assert set(seen.values()) == {torch.float32}


@pytest.mark.parametrize("method", ["gq", "daiq"])
def test_bfloat16_outputs_written_by_the_products_change_no_value(monkeypatch, method):
    """Under autocast the CPU products write the int8 layers' bfloat16 outputs and input gradients themselves
    (kernels.cpu.epilogue_dtypes). Outputs and every gradient are bit for bit those of the int32 product
    followed by the bfloat16 epilogue."""
    from kernels import cpu

    asked = []
    real_forward = cpu.conv_forward

    def spy(*args, **kw):
        asked.append(kw.get("out_dtype"))
        return real_forward(*args, **kw)

    monkeypatch.setattr(cpu, "conv_forward", spy)
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(cpu, "epilogue_dtypes", lambda: (torch.float32,))
        torch.manual_seed(0)
        model = quantize_model(_small_net().to(memory_format=torch.channels_last), method, skip=("first",))
        x = torch.randn(4, 3, 12, 12).contiguous(memory_format=torch.channels_last).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().square().mean().backward()
        results.append([out.detach(), x.grad] + [p.grad for p in model.parameters()])
    assert asked.count(torch.bfloat16) == 2 and asked.count(None) == 2  # two int8 convolutions each run
    assert results[0][0].dtype == torch.bfloat16
    for got, want in zip(*results, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: runs where there is one")
@pytest.mark.parametrize("method", ["gq", "daiq", "ui8"])
def test_gpu_training_step_waits_for_the_device_only_at_the_optimizer_step(method):
    """No host synchronisation inside forward and backward (torch's sync debug mode raises on one); the
    non-finite flag is read once, before the optimizer step (repro.lr_scaling)."""
    from repro import LayerLrScaling

    torch.manual_seed(0)
    model = (
        quantize_model(_small_net("cuda").to(memory_format=torch.channels_last), method, period=1)
        if (method == "ui8")
        else quantize_model(_small_net("cuda").to(memory_format=torch.channels_last), method)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    LayerLrScaling(model, opt)
    x = torch.randn(8, 3, 16, 16, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 5, (8,), device="cuda")
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        opt.step()
    assert torch.isfinite(loss)


class _SharedHead(nn.Module):
    """One convolution applied to several feature maps per forward pass, as a detector's head is to
    every FPN level."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, xs):
        return sum((self.head(self.stem(x)) * (i + 1)).square().mean() for i, x in enumerate(xs))


def test_a_layer_called_several_times_gets_one_method_state_per_call():
    from repro.layers import load_method_state_dict, method_state_dict

    torch.manual_seed(0)
    xs = [torch.randn(2, 3, 8, 8) * scale for scale in (0.1, 1.0, 10.0)]
    shared = quantize_model(_SharedHead(), "daiq", skip=())
    per_call = quantize_model(copy.deepcopy(_SharedHead()), "daiq", skip=(), per_call_state=True)
    per_call.load_state_dict(shared.state_dict())
    for model in (shared, per_call):
        for _ in range(2):
            model(xs).backward()
    assert shared.head.int8_calls is None and shared.head.int8.step == 6  # one state saw every call
    calls = per_call.head.int8_calls
    assert len(calls) == 3 and [q.step for q in calls] == [2, 2, 2] and calls[0] is per_call.head.int8
    # the three calls' gradients differ in scale by 10x: each state's clip values follow its own call
    maxima = [float(q.scale.max()) for q in calls]
    assert maxima[0] < maxima[1] < maxima[2]
    state = method_state_dict(per_call)
    assert len(state["head"]["calls"]) == 3
    fresh = quantize_model(copy.deepcopy(_SharedHead()), "daiq", skip=(), per_call_state=True)
    load_method_state_dict(fresh, state)
    assert [q.step for q in fresh.head.int8_calls] == [2, 2, 2]
    assert all(torch.equal(a.scale, b.scale) for a, b in zip(fresh.head.int8_calls, calls, strict=True))
    with pytest.raises(KeyError, match="one state per call"):
        load_method_state_dict(quantize_model(copy.deepcopy(_SharedHead()), "daiq", skip=()), state)
