"""INT8 compute backends: kernels.cpu must equal kernels.reference bit for bit, and kernels.reference
must equal torch's own float64 convolutions (exact for int8 operands) - an independent check.

Every output is checked for dtype int32 and shape. The large-magnitude cases force the exact fallback
of the fp32-output oneDNN path (and check that it was taken); others disable the fast paths to test
the fallbacks on their own.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn import grad as tgrad

import kernels
from kernels import cpu, reference
from kernels.cpu import im2col, memory, onednn, products, routes

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_INPUT = {1: tgrad.conv1d_input, 2: tgrad.conv2d_input, 3: tgrad.conv3d_input}
CONV_WEIGHT = {1: tgrad.conv1d_weight, 2: tgrad.conv2d_weight, 3: tgrad.conv3d_weight}
SPATIAL = {1: (9,), 2: (7, 8), 3: (5, 4, 5)}  # odd and even sizes (output_padding ambiguity for s=2)
CIN, COUT = 4, 8


def rand_i8(shape, gen, lo=-127, hi=127) -> torch.Tensor:
    return torch.randint(lo, hi + 1, tuple(shape), generator=gen, dtype=torch.int8)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.dtype == torch.int32, f"{what}: dtype {got.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(got, want.to(torch.int32)), f"{what}: values differ in {(got != want).sum()} places"


def out_shape(x_shape, w_shape, s, p, d):
    return tuple(
        (x_shape[2 + i] + 2 * p - d * (w_shape[2 + i] - 1) - 1) // s + 1 for i in range(len(x_shape) - 2)
    )


def conv_case(nd, k, s, p, d, groups, n, gen):
    """Random int8 x, w, g for a conv; None if the configuration has an empty output."""
    wcin = 1 if groups == "dw" else CIN // groups
    x = rand_i8((n, CIN, *SPATIAL[nd]), gen)
    w = rand_i8((COUT, wcin, *(k,) * nd), gen)
    out = out_shape(x.shape, w.shape, s, p, d)
    if min(out) < 1:
        return None
    g = rand_i8((n, COUT, *out), gen)
    return x, w, g


def both(nd, k, s, p, d, groups, x, w, g, backend):
    grp = CIN if groups == "dw" else groups
    return (
        backend.conv_forward(x, w, s, p, d, grp),
        backend.conv_input_grad(g, w, x.shape, s, p, d, grp),
        backend.conv_weight_grad(x, g, w.shape, s, p, d, grp),
    )


# ------------------------------------------------------------------------------------------------
# dispatch


def test_get_backend():
    assert kernels.get_backend("cpu") is cpu
    assert kernels.get_backend(torch.device("cpu")) is cpu
    # the CUDA backend's dispatch is tested in tests/test_cuda_backend.py
    with pytest.raises(NotImplementedError):
        kernels.get_backend("meta")
    for name in reference.__all__:
        assert callable(getattr(cpu, name)) and callable(getattr(reference, name))


# ------------------------------------------------------------------------------------------------
# the reference against torch float64 (exact: int8 products summed in float64 stay far below 2^53)

REF_GRID = [
    (nd, k, s, p, d, groups)
    for nd in (1, 2, 3)
    for k, s, p, d, groups in [
        (3, 1, 1, 1, 1),
        (3, 2, 1, 1, 2),
        (3, 2, 1, 2, "dw"),
        (1, 2, 0, 1, 1),
        (1, 1, 1, 1, 2),
        (5 if nd == 1 else 3, 3, 2, 1, 1),
    ]
]


@pytest.mark.parametrize("nd,k,s,p,d,groups", REF_GRID)
def test_reference_matches_torch_float64(nd, k, s, p, d, groups):
    gen = torch.Generator().manual_seed(1000 + REF_GRID.index((nd, k, s, p, d, groups)))
    case = conv_case(nd, k, s, p, d, groups, 2, gen)
    assert case is not None
    x, w, g = case
    grp = CIN if groups == "dw" else groups
    kw = dict(stride=s, padding=p, dilation=d, groups=grp)
    y, dx, dw = both(nd, k, s, p, d, groups, x, w, g, reference)
    assert_same(y, CONV[nd](x.double(), w.double(), **kw), "forward")
    assert_same(dx, CONV_INPUT[nd](x.shape, w.double(), g.double(), **kw), "input grad")
    assert_same(dw, CONV_WEIGHT[nd](x.double(), w.shape, g.double(), **kw), "weight grad")


def test_reference_linear_matches_float64():
    gen = torch.Generator().manual_seed(7)
    x, w, g = rand_i8((5, 33), gen), rand_i8((6, 33), gen), rand_i8((5, 6), gen)
    assert_same(reference.linear_forward(x, w), x.double() @ w.double().t())
    assert_same(reference.linear_input_grad(g, w), g.double() @ w.double())
    assert_same(reference.linear_weight_grad(x, g), g.double().t() @ x.double())


def test_reference_refuses_int32_overflow():
    k = 133_145  # just past the int32 contract: 127^2 * K > 2^31 - 1
    x = torch.full((1, k), 127, dtype=torch.int8)
    with pytest.raises(OverflowError):
        reference.linear_forward(x, x)
    with pytest.raises(TypeError):
        reference.linear_forward(x.int(), x)


# ------------------------------------------------------------------------------------------------
# cpu == reference, bit for bit

CPU_GRID = [
    (nd, k, s, p, d, groups, n)
    for nd in (1, 2, 3)
    for k in ((1, 3, 5) if nd == 1 else (1, 3))
    for s, p, d in itertools.product((1, 2), (0, 1), (1, 2))
    for groups, n in ((1, 2), (2, 1), ("dw", 3))
]


@pytest.mark.parametrize(
    "route,nd,k,s,p,d,groups,n",
    [("onednn", *case) for case in CPU_GRID] + [("im2col", *case) for case in CPU_GRID if case[5] == 1],
)
def test_cpu_conv_matches_reference(monkeypatch, route, nd, k, s, p, d, groups, n):
    """route: oneDNN wherever it applies, or im2col + _int_mm for every ungrouped convolution."""
    monkeypatch.setattr(routes, "SMALL_OUT", 0 if route == "onednn" else 1 << 30)
    gen = torch.Generator().manual_seed(CPU_GRID.index((nd, k, s, p, d, groups, n)))
    case = conv_case(nd, k, s, p, d, groups, n, gen)
    if case is None:
        pytest.skip("empty output")
    x, w, g = case
    want = both(nd, k, s, p, d, groups, x, w, g, reference)
    got = both(nd, k, s, p, d, groups, x, w, g, cpu)
    for what, a, b in zip(("forward", "input grad", "weight grad"), got, want, strict=True):
        assert_same(a, b, what)


# +-127 everywhere with one sign per output channel: the largest sums every pass forms. K = Cin/groups *
# prod(k) of 1152 and 1440 takes the sums past 2^24 (oneDNN's fp32 output is then inexact: the guards'
# fallbacks must run); depthwise goes to the native kernels.
ADVERSARIAL = {  # name: (cin, cout, groups, kernel, stride, padding, dilation)
    "grouped": (256, 8, 2, 3, 1, 1, 1),
    "depthwise-strided": (16, 16, 16, 3, 2, 1, 1),
    "dilated": (160, 4, 1, 3, 1, 2, 2),
}


def adversarial_case(cin, cout, groups, k, s, p, d):
    x = torch.full((2, cin, 6, 6), 127, dtype=torch.int8)
    x[1] = -127
    w = torch.full((cout, cin // groups, k, k), 127, dtype=torch.int8)
    w[1::2] = -127
    g = torch.full(reference.conv_forward(x, w, s, p, d, groups).shape, 127, dtype=torch.int8)
    g[:, 1::2] = -127
    return x, w, g


def assert_passes_exact(backend, x, w, g, args) -> None:
    """The backend's forward, input and weight gradient equal the reference's, bit for bit."""
    assert_same(backend.conv_forward(x, w, *args), reference.conv_forward(x, w, *args), "forward")
    assert_same(
        backend.conv_input_grad(g, w, x.shape, *args), reference.conv_input_grad(g, w, x.shape, *args)
    )
    assert_same(
        backend.conv_weight_grad(x, g, w.shape, *args), reference.conv_weight_grad(x, g, w.shape, *args)
    )


@pytest.mark.parametrize("route", ["onednn", "im2col"])
@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_cpu_every_pass_exact_at_adversarial_operands(monkeypatch, route, name):
    cin, cout, groups, k, s, p, d = ADVERSARIAL[name]
    monkeypatch.setattr(routes, "SMALL_OUT", 0 if route == "onednn" else 1 << 30)
    x, w, g = adversarial_case(cin, cout, groups, k, s, p, d)
    assert_passes_exact(cpu, x, w, g, (s, p, d, groups))


def test_cpu_linear_passes_exact_at_the_int32_limit():
    k = 133_000  # 127^2 * k = 2,145,157,000, just under 2^31 - 1
    x = torch.full((2, k), 127, dtype=torch.int8)
    x[1] = -127
    w = torch.full((3, k), 127, dtype=torch.int8)
    w[1] = -127
    assert int(cpu.linear_forward(x, w)[0, 0]) == k * 127**2
    assert_same(cpu.linear_forward(x, w), reference.linear_forward(x, w), "forward")
    g = torch.full((1100, 2), 127, dtype=torch.int8)  # input grad reduces over N = 2; weight grad over M
    g[:, 1] = -127
    wide = torch.full((2, 64), -127, dtype=torch.int8)
    assert_same(cpu.linear_input_grad(g, wide), reference.linear_input_grad(g, wide), "input grad")
    xs = torch.full((1100, 64), 127, dtype=torch.int8)
    assert_same(cpu.linear_weight_grad(xs, g), reference.linear_weight_grad(xs, g), "weight grad")


def layouts(t: torch.Tensor):
    """The same values as contiguous, channels-last and non-contiguous (strided, transposed) tensors."""
    yield "contiguous", t.contiguous()
    yield "channels-last", t.movedim(1, -1).contiguous().movedim(-1, 1)
    big = torch.zeros((t.shape[0], t.shape[1] * 2, *[a * 2 for a in t.shape[2:]]), dtype=t.dtype)
    view = big[(slice(None), slice(None, None, 2)) + tuple(slice(1, None, 2) for _ in t.shape[2:])]
    view.copy_(t)
    yield "strided", view
    yield "batch-transposed", t.transpose(0, 1).contiguous().transpose(0, 1)


@pytest.mark.parametrize("small_out", [0, 10**6])  # oneDNN where exact, or im2col + _int_mm
@pytest.mark.parametrize("chunk", [1, 2, None])
@pytest.mark.parametrize(
    "nd,k,s,p,d,groups",
    [(2, 3, 2, 1, 1, 2), (1, 3, 1, 1, 2, 1), (3, 3, 1, 1, 1, "dw"), (2, 3, 2, 1, 1, 1), (2, 1, 2, 0, 1, 1)],
)
def test_cpu_conv_any_layout(monkeypatch, nd, k, s, p, d, groups, chunk, small_out):
    """Contiguous, channels-last and strided operands and weights; batch chunks of 1, 2 (+ 1) or 3 images."""
    monkeypatch.setattr(routes, "SMALL_OUT", small_out)
    monkeypatch.setattr(routes, "CHUNK_IMAGES", chunk)
    gen = torch.Generator().manual_seed(5)
    x, w, g = conv_case(nd, k, s, p, d, groups, 3, gen)
    want = both(nd, k, s, p, d, groups, x, w, g, reference)
    for (lx, xl), (_, gl), (lw, wl) in zip(layouts(x), layouts(g), itertools.cycle(layouts(w)), strict=False):
        got = both(nd, k, s, p, d, groups, xl, wl, gl, cpu)
        for what, a, b in zip(("forward", "input grad", "weight grad"), got, want, strict=True):
            assert_same(a, b, f"{what} ({lx} operands, {lw} weight)")


@pytest.mark.parametrize("nd,s", [(1, 1), (2, 1), (2, 2), (3, 2)])
def test_cpu_im2col_products_read_a_channels_last_weight_without_copying_it(monkeypatch, nd, s):
    # forward: the channels-last weight itself; input gradient: its tap-major transposed copy, made from
    # rows of Cin codes (a transposing copy of int8 moves single bytes, several times slower)
    monkeypatch.setattr(routes, "SMALL_OUT", 10**6)
    gen = torch.Generator().manual_seed(3)
    x, w, g = conv_case(nd, 3, s, 1, 1, 1, 2, gen)
    w_cl = w.movedim(1, -1).contiguous().movedim(-1, 1)
    operands = []
    real_mm = im2col.mm

    def spy(a, b, out=None):
        operands.append(b)
        return real_mm(a, b, out)

    monkeypatch.setattr(im2col, "mm", spy)
    assert_same(cpu.conv_forward(x, w_cl, s, 1), reference.conv_forward(x, w, s, 1), "forward")
    storage = w_cl.untyped_storage().data_ptr()
    assert operands and all(b.untyped_storage().data_ptr() == storage for b in operands)
    operands.clear()
    made = []
    real_transposed = products.tap_major_transposed

    def spy_transposed(*args):
        made.append(real_transposed(*args))
        return made[-1]

    monkeypatch.setattr(products, "tap_major_transposed", spy_transposed)
    want = reference.conv_input_grad(g, w, x.shape, s, 1)
    assert_same(cpu.conv_input_grad(g, w_cl, x.shape, s, 1), want, "input grad")
    assert len(operands) == len(made) > 0
    for b, t in zip(operands, made, strict=True):
        assert b.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


@pytest.mark.parametrize("layout", ["contiguous", "channels-last"])
@pytest.mark.parametrize("taps", [[[2, 1, 0], [2, 1, 0]], [[0, 1, 2], [2, 1, 0]], [[2, 0], [1]], [[0]] * 2])
def test_tap_major_transposed_one_op_and_tap_by_tap_agree(monkeypatch, layout, taps):
    """The transposed weight by a flip and one copy (small weights with every tap) and tap by tap: the same
    codes, each laid out tap-major, (*taps, Cout, Cin) contiguous in memory."""
    gen = torch.Generator().manual_seed(5)
    w = rand_i8((6, 4, 3, 3), gen)
    w = w.contiguous(memory_format=torch.channels_last) if layout == "channels-last" else w
    got = {}
    for one_op in (True, False):
        monkeypatch.setattr(products, "TAP_MAJOR_ONE_OP", 1 << 16 if one_op else 0)
        got[one_op] = products.tap_major_transposed(w, taps)
    want = w.permute(1, 0, 2, 3)[:, :, taps[0]][:, :, :, taps[1]]
    for t in got.values():
        assert torch.equal(t, want)
        assert t.permute(2, 3, 1, 0).is_contiguous()


@pytest.mark.parametrize("chunk", [1, 2, None])
@pytest.mark.parametrize(
    "nd,k,s,p,d,groups,n",
    [
        (2, 3, 1, 1, 1, 1, 3),
        (2, 3, 2, 1, 2, 2, 3),
        (2, 1, 1, 0, 1, 1, 3),
        (2, 1, 2, 0, 1, 2, 4),
        (1, 5, 2, 2, 1, "dw", 3),
        (3, 3, 2, 1, 1, 1, 3),
        (3, 1, 1, 0, 1, "dw", 2),
    ],
)
def test_cpu_weight_grad_batch_chunks(monkeypatch, chunk, nd, k, s, p, d, groups, n):
    """The weight grad sums int32 partials over batch chunks: one image, two, or all at once."""
    monkeypatch.setattr(routes, "CHUNK_IMAGES", chunk)
    gen = torch.Generator().manual_seed(11)
    x, w, g = conv_case(nd, k, s, p, d, groups, n, gen)
    grp = CIN if groups == "dw" else groups
    want = reference.conv_weight_grad(x, g, w.shape, s, p, d, grp)
    for lx, xl in layouts(x):
        assert_same(cpu.conv_weight_grad(xl, g, w.shape, s, p, d, grp), want, f"chunk {chunk} ({lx})")


def test_cpu_many_groups_and_wide_channels():
    """Grouped conv with several channels per group (ResNeXt-like) and a depthwise multiplier."""
    gen = torch.Generator().manual_seed(3)
    for cin, cout, groups in ((64, 64, 16), (16, 48, 16), (24, 40, 8)):
        x = rand_i8((2, cin, 6, 7), gen)
        w = rand_i8((cout, cin // groups, 3, 3), gen)
        g = rand_i8((2, cout, 3, 4), gen)
        args = (2, 1, 1, groups)
        assert_same(cpu.conv_forward(x, w, *args), reference.conv_forward(x, w, *args))
        assert_same(
            cpu.conv_input_grad(g, w, x.shape, *args), reference.conv_input_grad(g, w, x.shape, *args)
        )
        assert_same(
            cpu.conv_weight_grad(x, g, w.shape, *args), reference.conv_weight_grad(x, g, w.shape, *args)
        )


@pytest.mark.parametrize("route", ["onednn", "im2col"])
def test_cpu_degenerate_sizes(monkeypatch, route):
    """Single channels, single images, 1x1 images: size-1 dimensions everywhere."""
    monkeypatch.setattr(routes, "SMALL_OUT", 0 if route == "onednn" else 1 << 30)
    gen = torch.Generator().manual_seed(9)
    for cin, cout, n, hw, k, p in [
        (1, 1, 1, 5, 3, 1),
        (1, 3, 2, 5, 1, 0),
        (3, 1, 2, 1, 1, 0),
        (1, 1, 3, 1, 3, 1),
    ]:
        x, w = rand_i8((n, cin, hw, hw), gen), rand_i8((cout, cin, k, k), gen)
        g = rand_i8((n, cout, hw, hw), gen)
        args = (1, p, 1, 1)
        assert_same(cpu.conv_forward(x, w, *args), reference.conv_forward(x, w, *args))
        assert_same(
            cpu.conv_input_grad(g, w, x.shape, *args), reference.conv_input_grad(g, w, x.shape, *args)
        )
        assert_same(
            cpu.conv_weight_grad(x, g, w.shape, *args), reference.conv_weight_grad(x, g, w.shape, *args)
        )


# ------------------------------------------------------------------------------------------------
# large magnitudes: the exact fallback behind the fp32-output oneDNN path


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_fast_paths_active_on_vnni():
    """On a VNNI/AMX machine the fast paths must pass their exactness probes (else they are skipped)."""
    if not cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        pytest.skip("no VNNI: the oneDNN/_int_mm paths may saturate and fall back")
    if os.environ.get("REPRO_CPU_GEMM") == "native" or os.environ.get("ONEDNN_MAX_CPU_ISA"):
        pytest.skip("the environment forces another route (REPRO_CPU_GEMM, ONEDNN_MAX_CPU_ISA)")
    assert routes.onednn_exact() is True
    assert routes.int_mm_exact() is True


@pytest.fixture(params=["scan", "bounded"])
def guard(request, monkeypatch):
    """The guard that keeps oneDNN's fp32 output exact: the output scan (VNNI) or the weight bound per
    input-channel block (AMX). The bounded guard is exact on every CPU and runs everywhere; the scan runs
    where oneDNN does not round before compensating (not on AMX, where that guard is what fails)."""
    if request.param == "scan" and routes.onednn_bounded():
        pytest.skip("oneDNN needs the bounded guard here (AMX, or a failed compensation probe)")
    monkeypatch.setattr(routes, "onednn_bounded", lambda: request.param == "bounded")
    # oneDNN is what these tests check: the convolutions the AMX GEMM would take stay on it
    monkeypatch.setattr(routes, "native_conv_on_tiles", lambda cin, groups: False)
    monkeypatch.setattr(routes, "native_grouped_conv", lambda cin, cout, groups: False)
    return request.param


@pytest.fixture
def exact_calls(monkeypatch, guard):
    """Records calls of the exact fallback; oneDNN is made the route for every shape. Only where oneDNN's
    int8 convolution is exact (VNNI): elsewhere every convolution takes the exact route by design."""
    if not routes.onednn_exact():
        pytest.skip("oneDNN's int8 convolution is not exact on this CPU (no VNNI): no fast path to check")
    monkeypatch.setattr(routes, "SMALL_OUT", 0)
    calls = []
    real = im2col.conv_exact

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(im2col, "conv_exact", spy)
    return calls


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_cpu_large_magnitude_forces_exact_fallback(monkeypatch, exact_calls, nd, chunked):
    """+-127 operands with reductions of 1536 * 3^nd: |acc| up to 127^2 K >> 2^24 (inexact in fp32).

    chunked: one image per oneDNN call, the second image small, so only the first chunk falls back.
    """
    if chunked:
        monkeypatch.setattr(routes, "CHUNK_IMAGES", 1)
    gen = torch.Generator().manual_seed(nd)
    c, k = 1536, (3,) * nd
    sp = {1: (6,), 2: (4, 3), 3: (3, 3, 2)}[nd]

    def mostly_plus(shape):
        return torch.where(torch.rand(shape, generator=gen) < 0.9, 127, -127).to(torch.int8)

    x = mostly_plus((2, c, *sp))
    if chunked:
        x[1] = rand_i8(x[1].shape, gen, -2, 2)
    w = torch.full((3, c, *k), 127, dtype=torch.int8)
    w[1] = -127
    w[2, ::2] = -127  # a channel with small sums: both sides of 2^24 in one output
    want = reference.conv_forward(x, w, 1, 1, 1, 1)
    assert want.abs().max() >= 2**24
    assert_same(cpu.conv_forward(x, w, 1, 1, 1, 1), want, "forward")
    assert len(exact_calls) == 1, "the forward fallback was not taken (once)"

    exact_calls.clear()
    g = mostly_plus((2, c, *sp))  # the input grad reduces over Cout * prod(k) = c * 3^nd
    if chunked:
        g[1] = rand_i8(g[1].shape, gen, -2, 2)
    wt = torch.full((c, 3, *k), 127, dtype=torch.int8)
    wt[:, 1] = -127
    want = reference.conv_input_grad(g, wt, (2, 3, *sp), 1, 1, 1, 1)
    assert want.abs().max() >= 2**24
    assert_same(cpu.conv_input_grad(g, wt, (2, 3, *sp), 1, 1, 1, 1), want, "input grad")
    assert len(exact_calls) == 1, "the input-grad fallback was not taken (once)"


@pytest.mark.parametrize("chunk", [1, None])
def test_cpu_strided_input_grad_fallback_into_dx(monkeypatch, exact_calls, chunk):
    """Stride 2: the phases are written straight into dx, from oneDNN chunks or their exact fallback."""
    monkeypatch.setattr(routes, "CHUNK_IMAGES", chunk)
    gen = torch.Generator().manual_seed(17)
    c = 1536  # the 2x2 and 2x1 phases reduce over c * 4 and c * 2 products of +-127: >> 2^24
    g = torch.where(torch.rand((2, c, 3, 3), generator=gen) < 0.9, 127, -127).to(torch.int8)
    g[1] = rand_i8(g[1].shape, gen, -2, 2)  # a small second image: only its first chunk falls back
    w = torch.full((c, 3, 3, 3), 127, dtype=torch.int8)
    w[:, 1] = -127
    x_shape = (2, 3, 6, 5)
    want = reference.conv_input_grad(g, w, x_shape, 2, 1, 1, 1)
    assert want.abs().max() >= 2**24
    assert_same(cpu.conv_input_grad(g, w, x_shape, 2, 1, 1, 1), want, "strided input grad")
    assert any(tuple(shape[2:]) != (1, 1) for shape in exact_calls), "no oneDNN phase fell back"


def test_cpu_large_bound_small_values_stays_fast(exact_calls, guard):
    """The a-priori bound exceeds 2^24 but the actual sums do not: the scan guard keeps the fast path."""
    if guard == "bounded":
        pytest.skip("the bounded guard decides from the weights alone (test_cpu_bounded_guard_*)")
    gen = torch.Generator().manual_seed(2)
    x = rand_i8((2, 1536, 5, 5), gen, -3, 3)
    w = torch.full((4, 1536, 3, 3), 127, dtype=torch.int8)
    w[:, 1::2] = -127
    assert_same(cpu.conv_forward(x, w, 1, 1, 1, 1), reference.conv_forward(x, w, 1, 1, 1, 1))
    assert not exact_calls


def amx_like_qconv(xu, wq, packed, s, p, d, groups):
    """oneDNN's int8 convolution as an AMX Xeon computed it (issue 31's measurements): the uncompensated
    sum of (x + 128) * w rounded to fp32 before the compensation 128 * sum(w) is subtracted."""
    nd = wq.dim() - 2
    pad = [v for pi in reversed(p) for v in (pi, pi)]
    xpad = F.pad(xu.double(), pad, value=128)  # a padded position holds the zero point: x = 0
    unc = CONV[nd](xpad, wq.double(), stride=s, dilation=d, groups=groups)
    comp = 128 * wq.double().flatten(1).sum(1).view(1, -1, *(1,) * nd)
    y = unc.float() - comp.float()
    return y.movedim(1, -1).contiguous().movedim(-1, 1)


def small_values_big_weights(gen, n=2, c=160, hw=5, cout=16):
    """x near 0 (codes in [-2, 2]), w = +-127: exact sums far below 2^24, uncompensated ones above it."""
    x = rand_i8((n, c, hw, hw), gen, -2, 2)
    w = torch.full((cout, c, 3, 3), 127, dtype=torch.int8)
    w[cout // 2 :] = -127
    return x, w


def test_amx_emulation_defeats_the_scan_guard(monkeypatch):
    """Why AMX needs its own guard: with oneDNN rounding before compensating, the scan sees only small
    outputs and lets wrong ones through (the failure issue 31 measured)."""
    monkeypatch.setattr(onednn, "run", amx_like_qconv)
    monkeypatch.setattr(routes, "native_conv_on_tiles", lambda cin, groups: False)
    monkeypatch.setattr(routes, "onednn_bounded", lambda: False)
    monkeypatch.setattr(routes, "onednn_exact", lambda: True)
    monkeypatch.setattr(routes, "SMALL_OUT", 0)
    x, w = small_values_big_weights(torch.Generator().manual_seed(21))
    want = reference.conv_forward(x, w, 1, 1, 1, 1)
    assert want.abs().max() < 2**20
    assert not torch.equal(cpu.conv_forward(x, w, 1, 1, 1, 1), want)
    assert routes.compensation_rounds.__wrapped__() is True  # the probe sees it too


@pytest.mark.parametrize("chunk", [1, None])
def test_cpu_bounded_guard_splits_input_channels(monkeypatch, chunk):
    """The bounded guard under the AMX emulation: exact, through oneDNN, in input-channel blocks whose
    weights keep every sum below 2^24 (forward and input gradient, one image per chunk or all)."""
    calls = []

    def spy(xu, wq, *args):
        calls.append(wq.shape[1])
        return amx_like_qconv(xu, wq, *args)

    monkeypatch.setattr(onednn, "run", spy)
    monkeypatch.setattr(routes, "onednn_bounded", lambda: True)
    monkeypatch.setattr(routes, "onednn_exact", lambda: True)
    monkeypatch.setattr(routes, "SMALL_OUT", 0)
    monkeypatch.setattr(routes, "CHUNK_IMAGES", chunk)
    monkeypatch.setattr(routes, "native_conv_on_tiles", lambda cin, groups: False)
    x, w = small_values_big_weights(torch.Generator().manual_seed(22))
    blocks = onednn.channel_blocks(w, 1)
    assert 1 < len(blocks) <= onednn.MAX_BLOCKS
    assert blocks[0][0] == 0 and blocks[-1][1] == w.shape[1]
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
    for c0, c1 in blocks:
        assert onednn.AMX_SUM * int(w[:, c0:c1].int().abs().flatten(1).sum(1).max()) < 2**24
    assert_same(cpu.conv_forward(x, w, 1, 1, 1, 1), reference.conv_forward(x, w, 1, 1, 1, 1), "forward")
    assert sum(calls) == w.shape[1] * (x.shape[0] if chunk else 1), "not every block went through oneDNN"
    # input gradient, stride 2: every phase's sub-kernel is bounded (and split) on its own
    g = rand_i8((2, 160, 3, 3), torch.Generator().manual_seed(23), -2, 2)
    wt = torch.full((160, 8, 3, 3), 127, dtype=torch.int8)
    wt[:, ::2] = -127
    want = reference.conv_input_grad(g, wt, (2, 8, 6, 5), 2, 1, 1, 1)
    assert_same(cpu.conv_input_grad(g, wt, (2, 8, 6, 5), 2, 1, 1, 1), want, "strided input grad")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1, None])
@pytest.mark.parametrize("weights", ["one block", "several blocks"])
def test_onednn_scales_its_own_output_as_the_epilogue(monkeypatch, guard, chunk, weights, out_dtype):
    """With out_scale, a convolution oneDNN runs in one proven block has oneDNN's weight scale apply the
    dequantizing epilogue (no int32 pass, no epilogue pass): bit for bit dequantize(reference) in every
    case, forward and input gradient (stride 1 and the phases of stride 2), one image per chunk or all;
    several blocks, or a scanned output, keep the int32 sum and the epilogue. With out_dtype bfloat16
    oneDNN writes the rounded bfloat16 itself, bit for bit dequantize(..., dtype=bfloat16)."""
    if not routes.onednn_exact():
        pytest.skip("oneDNN's int8 convolution is not this CPU's route")
    monkeypatch.setattr(routes, "SMALL_OUT", 0)
    monkeypatch.setattr(routes, "CHUNK_IMAGES", chunk)
    scaled = []
    real_run = onednn.run

    def spy(*args):
        scaled.append(len(args) > 7)
        if len(args) > 8:  # an output dtype is asked for only with the scale
            assert args[8] == out_dtype == torch.bfloat16
        return real_run(*args)

    monkeypatch.setattr(onednn, "run", spy)
    gen = torch.Generator().manual_seed(31)
    if weights == "one block":
        x, w = rand_i8((3, 40, 9, 8), gen), rand_i8((24, 40, 3, 3), gen, -20, 20)
    else:
        x, w = small_values_big_weights(gen, n=3, c=160, hw=6, cout=24)
    scale = torch.tensor(3.1e-5, dtype=torch.float32)
    for stride in (1, 2):
        args = (stride, 1, 1, 1)
        y = reference.conv_forward(x, w, *args)
        g = rand_i8(tuple(y.shape), gen, -3, 3)
        kw = {"out_scale": scale, "out_dtype": out_dtype}
        for what, got, acc in [
            ("forward", cpu.conv_forward(x, w, *args, **kw), y),
            ("input grad", cpu.conv_input_grad(g, w, x.shape, *args, **kw),
             reference.conv_input_grad(g, w, x.shape, *args)),
        ]:  # fmt: skip
            acc = acc.to(torch.int32).contiguous(memory_format=torch.channels_last)
            want = cpu.dequantize(acc, scale, dtype=out_dtype)
            assert got.dtype == out_dtype and torch.equal(got, want), f"{what}, stride {stride}"
            assert got.is_contiguous(memory_format=torch.channels_last), f"{what}, stride {stride}"
    assert scaled, "oneDNN is this CPU's route, but no convolution reached it"
    if weights == "one block":  # the weights' bound proves every output exact: no scan, on either guard
        assert all(scaled)
    else:  # the forward pass scanned or in blocks: unscaled; a stride-2 phase's sub-kernel may fit one block
        assert not scaled[0] and not all(scaled)


@pytest.mark.parametrize(
    "x_shape,w_shape,geometry",
    [
        ((3, 16, 5, 6), (24, 16, 3, 3), (1, 1, 1, 1)),  # a small output: im2col + _int_mm
        ((3, 16, 9, 8), (24, 16, 1, 1), (1, 0, 1, 1)),  # 1x1: im2col's view + _int_mm (the native GEMM)
        ((2, 24, 9, 9), (24, 1, 3, 3), (2, 1, 1, 24)),  # depthwise: the native kernels
        ((2, 16, 10, 9), (8, 4, 3, 3), (2, 1, 1, 4)),  # grouped, strided phases
        (
            (2, 40, 20, 18),
            (24, 40, 3, 3),
            (2, 1, 1, 1),
        ),  # > 64 positions: oneDNN's phases where it is the route
    ],
)
def test_bfloat16_epilogue_on_every_route(x_shape, w_shape, geometry):
    """out_dtype bfloat16 on whichever route a shape takes here: bit for bit dequantize(reference, dtype=
    bfloat16), channels-last, forward and input gradient."""
    gen = torch.Generator().manual_seed(41)
    x, w = rand_i8(x_shape, gen), rand_i8(w_shape, gen, -20, 20)
    scale = torch.tensor(2.3e-4, dtype=torch.float32)
    y = reference.conv_forward(x, w, *geometry)
    g = rand_i8(tuple(y.shape), gen, -3, 3)
    kw = {"out_scale": scale, "out_dtype": torch.bfloat16}
    for what, got, acc in [
        ("forward", cpu.conv_forward(x, w, *geometry, **kw), y),
        ("input grad", cpu.conv_input_grad(g, w, x.shape, *geometry, **kw),
         reference.conv_input_grad(g, w, x.shape, *geometry)),
    ]:  # fmt: skip
        want = cpu.dequantize(acc.to(torch.int32).contiguous(memory_format=torch.channels_last), scale,
                              dtype=torch.bfloat16)  # fmt: skip
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), what
        assert got.is_contiguous(memory_format=torch.channels_last), what


@pytest.mark.parametrize("large", [True, False])
def test_large_pointwise_bfloat16_outputs_go_to_onednn(monkeypatch, large):
    """A 1x1 convolution with a bfloat16 epilogue on the bounded route (AMX), in one proven block: oneDNN
    scales and writes it where routes.pointwise_on_onednn calls its output large, im2col + _int_mm does
    elsewhere; forward and input gradient, stride 1 and 2, bit for bit dequantize(reference) either way."""
    if not routes.onednn_exact():
        pytest.skip("oneDNN's int8 convolution is not this CPU's route")
    monkeypatch.setattr(routes, "onednn_bounded", lambda: True)
    monkeypatch.setattr(routes, "native_gemm", lambda: False)  # (the AMX GEMM, where built, takes them first)
    monkeypatch.setattr(routes, "pointwise_on_onednn", lambda rows, cin, cout: large)
    calls = []
    real_run = onednn.run
    monkeypatch.setattr(onednn, "run", lambda *args: calls.append(1) or real_run(*args))
    gen = torch.Generator().manual_seed(43)
    x, w = rand_i8((2, 24, 10, 9), gen), rand_i8((40, 24, 1, 1), gen, -20, 20)
    scale = torch.tensor(1.7e-3, dtype=torch.float32)
    kw = {"out_scale": scale, "out_dtype": torch.bfloat16}
    for stride in (1, 2):
        y = reference.conv_forward(x, w, stride)
        g = rand_i8(tuple(y.shape), gen, -3, 3)
        for what, got, acc in [
            ("forward", cpu.conv_forward(x, w, stride, **kw), y),
            ("input grad", cpu.conv_input_grad(g, w, x.shape, stride, **kw),
             reference.conv_input_grad(g, w, x.shape, stride)),
        ]:  # fmt: skip
            acc = acc.to(torch.int32).contiguous(memory_format=torch.channels_last)
            want = cpu.dequantize(acc, scale, dtype=torch.bfloat16)
            assert torch.equal(got, want), f"{what}, stride {stride}"
    assert bool(calls) == large


def test_pointwise_on_onednn_wants_a_large_output():
    assert routes.pointwise_on_onednn(25088, 64, 256)  # ResNet-50's 56x56 expansion at batch 8
    assert routes.pointwise_on_onednn(12544, 256, 64)  # many rows for a short reduction
    assert not routes.pointwise_on_onednn(3136, 512, 128)  # a long reduction into a narrow output
    assert not routes.pointwise_on_onednn(784, 256, 1024)  # few rows: oneDNN's prepack decides


def test_native_conv_on_tiles_takes_ungrouped_convolutions_of_16n_channels(monkeypatch):
    """With the tile GEMM, ungrouped convolutions whose input channels its packing reads in 16-byte runs leave
    oneDNN; grouped ones, other channel counts, and every one without the tile GEMM stay."""
    monkeypatch.setattr(routes, "torch_int8_fast", lambda: True)
    monkeypatch.setattr(routes, "native_gemm", lambda: True)
    assert routes.native_conv_on_tiles(64, 1)
    assert not routes.native_conv_on_tiles(24, 1)
    assert not routes.native_conv_on_tiles(64, 2)
    monkeypatch.setattr(routes, "native_gemm", lambda: False)
    assert not routes.native_conv_on_tiles(64, 1)


def test_bfloat16_epilogue_needs_a_scale():
    """An int32 result has no bfloat16 form, and other dtypes are not written: one clear error each."""
    x, w = torch.zeros((1, 4, 3, 3), dtype=torch.int8), torch.zeros((2, 4, 1, 1), dtype=torch.int8)
    with pytest.raises(ValueError, match="needs out_scale"):
        cpu.conv_forward(x, w, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype must be"):
        cpu.conv_input_grad(x[:, :2], w, x.shape, out_scale=torch.tensor(1.0), out_dtype=torch.float16)


def test_cpu_bounded_guard_gives_up_beyond_its_blocks():
    """Too many blocks, one channel alone over the bound, or a grouped weight over it: the exact route."""
    big = torch.full((4, 1536, 3, 3), 127, dtype=torch.int8)
    assert onednn.channel_blocks(big, 1) is None  # 40 blocks
    assert onednn.channel_blocks(torch.full((2, 1, 19, 19), 127, dtype=torch.int8), 1) is None
    assert onednn.channel_blocks(torch.full((8, 64, 3, 3), 127, dtype=torch.int8), 2) is None
    assert onednn.channel_blocks(torch.full((8, 32, 3, 3), 127, dtype=torch.int8), 2) == [(0, 32)]


@pytest.mark.parametrize("cap,amx", [("", True), ("AVX512_CORE_VNNI", False), ("avx512_core_amx", True)])
def test_amx_route_follows_the_cpu_and_onednn_cap(monkeypatch, cap, amx):
    """The bounded guard is chosen where oneDNN may run AMX kernels: AMX tiles, not capped below AMX."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert routes.amx_in_use() is amx
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert routes.amx_in_use() is False


def test_conv_route_names_this_cpus_route():
    """The route the README's table gives this CPU, unless the environment forces another."""
    route = cpu.conv_route()
    assert route in ("native", "im2col", "onednn-scan", "onednn-bounded")
    if os.environ.get("REPRO_CPU_GEMM") == "native":
        assert route == "native"
    elif os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"):
        return  # oneDNN capped: its probe decides
    elif cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        forced = os.environ.get("REPRO_ONEDNN_GUARD") == "bounded"
        assert route == ("onednn-bounded" if forced or "amx_int8" in cpu_flags() else "onednn-scan")


@pytest.mark.parametrize("where", ["prepack", "run"])
def test_onednn_refusal_takes_the_exact_route(monkeypatch, guard, where):
    """oneDNN refusing a shape (prepack: 'could not create a primitive descriptor for the reorder
    primitive', seen on AMX for regnet_x_8gf's grouped convolutions) never kills a run."""
    if not routes.onednn_exact():
        pytest.skip("oneDNN's int8 convolution is not this CPU's route")
    monkeypatch.setattr(routes, "SMALL_OUT", 0)
    monkeypatch.setattr(onednn, "REFUSED", set())
    gen = torch.Generator().manual_seed(24)
    x, w = rand_i8((2, 24, 5, 5), gen), rand_i8((24, 6, 3, 3), gen, -20, 20)
    ran, real_run = [], onednn.run
    monkeypatch.setattr(onednn, "run", lambda *args: ran.append(1) or real_run(*args))
    assert_same(cpu.conv_forward(x, w, 1, 1, 1, 4), reference.conv_forward(x, w, 1, 1, 1, 4))
    assert ran, "oneDNN is this CPU's route, but the grouped convolution did not reach it"
    asked = []

    def refuse(*args):
        asked.append(1)
        raise RuntimeError("could not create a primitive descriptor for the reorder primitive")

    monkeypatch.setattr(onednn, "prepack" if where == "prepack" else "run", refuse)
    for _ in range(2):
        assert_same(cpu.conv_forward(x, w, 1, 1, 1, 4), reference.conv_forward(x, w, 1, 1, 1, 4))
    assert len(asked) == (1 if where == "prepack" else 2), "a refused prepack is asked again"


def test_regnet_x_8gf_grouped_shape_is_exact(guard):
    """regnet_x_8gf's grouped 3x3 convolution (120 channels per group, 1920 channels), oneDNN refuses
    it on AMX; weights small enough for the bounded guard to reach oneDNN. All three passes."""
    gen = torch.Generator().manual_seed(25)
    x, w = rand_i8((2, 1920, 4, 4), gen), rand_i8((1920, 120, 3, 3), gen, -12, 12)
    g = rand_i8((2, 1920, 2, 2), gen)
    args = (2, 1, 1, 16)
    assert_same(cpu.conv_forward(x, w, *args), reference.conv_forward(x, w, *args), "forward")
    assert_same(
        cpu.conv_input_grad(g, w, x.shape, *args), reference.conv_input_grad(g, w, x.shape, *args), "dx"
    )
    assert_same(
        cpu.conv_weight_grad(x, g, w.shape, *args), reference.conv_weight_grad(x, g, w.shape, *args), "dw"
    )


def test_cpu_large_weight_grad_reduction():
    """Weight grad sums over N * positions = 2 * 96 * 96 = 18432 terms of +-127^2 (no fp32 anywhere)."""
    x = torch.full((2, 3, 96, 96), 127, dtype=torch.int8)
    x[:, 1] = -127
    g = torch.full((2, 4, 96, 96), 127, dtype=torch.int8)
    for args in ((1, 1, 1, 1), (1, 0, 1, 1)):
        w_shape = (4, 3, 3, 3) if args[1] else (4, 3, 1, 1)
        want = reference.conv_weight_grad(x, g, w_shape, *args)
        assert want.abs().max() >= 2**24
        assert_same(cpu.conv_weight_grad(x, g, w_shape, *args), want, f"weight grad {args}")


@pytest.mark.parametrize("disable", ["onednn_exact", "int_mm_exact", "both"])
def test_cpu_fallbacks_alone(monkeypatch, disable):
    """With the fast paths declared inexact (as on a CPU without VNNI) the results stay exact."""
    for name in ("onednn_exact", "int_mm_exact"):
        if disable in (name, "both"):
            monkeypatch.setattr(routes, name, lambda: False)
    gen = torch.Generator().manual_seed(4)
    for nd, k, s, p, d, groups, n in [(2, 3, 2, 1, 1, 2, 2), (1, 3, 1, 1, 2, "dw", 2), (3, 1, 2, 0, 1, 1, 1)]:
        x, w, g = conv_case(nd, k, s, p, d, groups, n, gen)
        want = both(nd, k, s, p, d, groups, x, w, g, reference)
        got = both(nd, k, s, p, d, groups, x, w, g, cpu)
        for what, a, b in zip(("forward", "input grad", "weight grad"), got, want, strict=True):
            assert_same(a, b, f"{what} {nd}d")
    x, w = rand_i8((3, 17), gen), rand_i8((5, 17), gen)
    assert_same(cpu.linear_forward(x, w), reference.linear_forward(x, w))
    # odd sums above 2^24 (not representable in fp32) through every fallback
    x, w = torch.full((2, 4099), 127, dtype=torch.int8), torch.full((3, 4099), 127, dtype=torch.int8)
    assert_same(cpu.linear_forward(x, w), reference.linear_forward(x, w), "large linear")
    x, w = (
        torch.full((1, 513, 3, 3), 127, dtype=torch.int8),
        torch.full((2, 513, 3, 3), 127, dtype=torch.int8),
    )
    want = reference.conv_forward(x, w, 1, 1, 1, 1)
    assert want.abs().max() > 2**24 and int(want.abs().max()) % 2 == 1
    assert_same(cpu.conv_forward(x, w, 1, 1, 1, 1), want, "large conv")


# ------------------------------------------------------------------------------------------------
# linear


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 1), (5, 1, 3), (2, 3, 1), (64, 48, 40), (33, 130, 17)])
def test_cpu_linear_matches_reference(m, k, n):
    """Includes size-1 dimensions (CPU torch._int_mm misreads their ambiguous strides if not copied)."""
    gen = torch.Generator().manual_seed(m * 10_000 + k * 100 + n)
    x, w, g = rand_i8((m, k), gen), rand_i8((n, k), gen), rand_i8((m, n), gen)

    def strided(t):
        return torch.zeros((t.shape[0] * 2, t.shape[1] * 3), dtype=torch.int8)[::2, ::3].copy_(t)

    variants = {
        "contiguous": (x, w, g),
        "transposed": tuple(t.t().contiguous().t() for t in (x, w, g)),
        "strided": tuple(strided(t) for t in (x, w, g)),
    }
    want = (
        reference.linear_forward(x, w),
        reference.linear_input_grad(g, w),
        reference.linear_weight_grad(x, g),
    )
    for name, (xv, wv, gv) in variants.items():
        got = (cpu.linear_forward(xv, wv), cpu.linear_input_grad(gv, wv), cpu.linear_weight_grad(xv, gv))
        for what, a, b in zip(("forward", "input grad", "weight grad"), got, want, strict=True):
            assert_same(a, b, f"{what} ({name})")
    assert want[0].shape == (m, n) and want[1].shape == (m, k) and want[2].shape == (n, k)


def test_cpu_huge_page_outputs():
    """Outputs from 32 MB are madvise-d for 2 MB pages before they are written: same values."""
    madvise = memory.libc_madvise()
    if madvise is not None:  # Linux: the call itself must succeed on such a buffer
        t = torch.empty(9 << 20, dtype=torch.int32)
        start = -(-t.data_ptr() // memory.HUGE_PAGE) * memory.HUGE_PAGE
        assert madvise(start, memory.HUGE_PAGE, memory.MADV_HUGEPAGE) == 0
    gen = torch.Generator().manual_seed(21)
    x, w = rand_i8((8192, 3), gen), rand_i8((1100, 3), gen)  # a 36 MB int32 result
    assert_same(cpu.linear_forward(x, w), reference.linear_forward(x, w))
    g = rand_i8((2, 8, 1, 1), gen)  # input grad of a 1x1 stride-2 conv into a 36 MB dx
    w = rand_i8((8, 2304, 1, 1), gen)
    x_shape = (2, 2304, 2, 1000)
    want = reference.conv_input_grad(g, w, x_shape, (2, 1000))
    assert_same(cpu.conv_input_grad(g, w, x_shape, (2, 1000)), want)


def test_cpu_linear_at_the_int32_limit():
    """K = 133,143 (the largest reduction the int32 contract guarantees) with all +-127."""
    k = 133_143
    assert k * 127**2 < 2**31 <= (k + 2) * 127**2
    x = torch.full((3, k), 127, dtype=torch.int8)
    x[1] = -127
    w = torch.full((2, k), 127, dtype=torch.int8)
    y = cpu.linear_forward(x, w)
    assert_same(y, reference.linear_forward(x, w))
    assert int(y[0, 0]) == k * 127**2
    assert_same(
        cpu.linear_weight_grad(x.t().contiguous(), w.t().contiguous()),
        reference.linear_weight_grad(x.t().contiguous(), w.t().contiguous()),
    )


# ------------------------------------------------------------------------------------------------
# argument checking


def test_cpu_rejects_bad_arguments():
    x = torch.zeros((1, 4, 5, 5), dtype=torch.int8)
    w = torch.zeros((8, 4, 3, 3), dtype=torch.int8)
    for backend in (cpu, reference):
        with pytest.raises(TypeError):
            backend.conv_forward(x.float(), w)
        with pytest.raises(ValueError):
            backend.conv_forward(x, w, groups=3)
        with pytest.raises(
            ValueError, match=r"grad_output has shape \(1, 8, 4, 4\), expected \(1, 8, 3, 3\)"
        ):
            backend.conv_input_grad(torch.zeros((1, 8, 4, 4), dtype=torch.int8), w, x.shape)
        with pytest.raises(ValueError, match="grad_output has shape"):
            backend.conv_weight_grad(x, torch.zeros((1, 8, 4, 4), dtype=torch.int8), w.shape)
        # stride/padding/dilation as tuples of the spatial rank are accepted
        y = backend.conv_forward(x, w, (1, 2), (1, 0), (1, 1), 1)
        assert y.dtype == torch.int32 and tuple(y.shape) == (1, 8, 5, 2)
        assert math.prod(y.shape) == y.numel()


# ------------------------------------------------------------------------------------------------
# every route at the int32 limit: +-127 operands, one sign per output channel, K just under 2^31 / 127^2

LIMIT_K = 132_993  # 127^2 * K = 2,145,044,097, just under 2^31 - 1: sums at the int32 contract's edge


def force_route(monkeypatch, route: str) -> None:
    """Make `route` this process's convolution route (skip where the CPU cannot take it exactly)."""
    if route == "native":
        if not kernels.cpu.runtime.available():
            pytest.skip("no native library here")
        monkeypatch.setenv("REPRO_CPU_GEMM", "native")
        cpu.clear_route_caches()
        return
    monkeypatch.setenv("REPRO_CPU_GEMM", "torch")  # depthwise too: its block-diagonal matmuls
    cpu.clear_route_caches()
    if not routes.onednn_exact():
        pytest.skip("oneDNN's int8 convolution is not exact on this CPU")
    monkeypatch.setattr(routes, "SMALL_OUT", 0)
    if route == "im2col":
        monkeypatch.setattr(routes, "onednn_exact", lambda: False)
    elif route == "scan" and routes.onednn_bounded():
        pytest.skip("oneDNN needs the bounded guard here")
    else:
        monkeypatch.setattr(routes, "onednn_bounded", lambda: route == "bounded")


def signed_rows(n: int, shape) -> torch.Tensor:
    """n slices of +127 and -127 alternating (one sign per output channel), each of `shape`."""
    t = torch.full((n, *shape), 127, dtype=torch.int8)
    t[1::2] = -127
    return t


@pytest.mark.parametrize("route", ["scan", "bounded", "native", "im2col"])
def test_every_route_is_exact_at_the_int32_limit(monkeypatch, route):
    """Grouped and dilated forward passes, a depthwise weight gradient and linear_input_grad whose sums
    reach +-127^2 * 132,993 (2^31 - 2.5M): through the oneDNN overflow fallback, the bounded guard's exact
    route, the native GEMM and im2col + _int_mm."""
    force_route(monkeypatch, route)
    cin_g = LIMIT_K // 9
    x = torch.full((1, 2 * cin_g, 3, 3), 127, dtype=torch.int8)
    w = signed_rows(2, (cin_g, 3, 3))
    want = reference.conv_forward(x, w, 1, 0, 1, 2)  # grouped: K = cin_g * 9 per group
    assert want.abs().max() == 127**2 * cin_g * 9
    assert_same(cpu.conv_forward(x, w, 1, 0, 1, 2), want, f"{route}: grouped forward")
    xd = torch.full((1, cin_g, 5, 5), 127, dtype=torch.int8)
    want = reference.conv_forward(xd, w, 1, 0, 2, 1)  # dilated 2: the 3x3 taps spread over 5x5
    assert_same(cpu.conv_forward(xd, w, 1, 0, 2, 1), want, f"{route}: dilated forward")
    side = 364  # 364^2 = 132,496 positions, the centre tap's sum
    xw = torch.full((1, 2, side, side), 127, dtype=torch.int8)
    g = signed_rows(2, (side, side)).unsqueeze(0)
    want = reference.conv_weight_grad(xw, g, (2, 1, 3, 3), 1, 1, 1, 2)
    assert want.abs().max() == 127**2 * side * side
    assert_same(
        cpu.conv_weight_grad(xw, g, (2, 1, 3, 3), 1, 1, 1, 2), want, f"{route}: depthwise weight grad"
    )
    gl = torch.full((2, LIMIT_K), 127, dtype=torch.int8)  # dL/dy, (M, N): the sum runs over N
    wl = signed_rows(3, (LIMIT_K,)).t().contiguous()  # the weight (N, K), one sign per input feature
    want = reference.linear_input_grad(gl, wl)
    assert want.abs().max() == 127**2 * LIMIT_K
    assert_same(cpu.linear_input_grad(gl, wl), want, f"{route}: linear input grad")


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_cpu_weight_grad_of_a_wide_weight_comes_channels_last_without_a_copy(nd):
    # Cout * Cin * prod(k) > N * positions: the product is (Cout, prod(k), Cin), a channels-last weight's
    # layout, and is returned as that view (a channels-last model's .grad then needs no copy)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (2, 16, *([4] * nd)), dtype=torch.int8, generator=gen)
    g = torch.randint(-127, 128, (2, 8, *([4] * nd)), dtype=torch.int8, generator=gen)
    w_shape = (8, 16, *([3] * nd))
    dw = cpu.conv_weight_grad(x, g, w_shape, 1, 1, 1, 1)
    assert dw.stride()[:2] == (16 * 3**nd, 1) and dw.stride()[-1] == 16
    assert_same(dw, reference.conv_weight_grad(x, g, w_shape, 1, 1, 1, 1), "dw")


@pytest.mark.parametrize("start_dim", [1, 2])
def test_abs_sums_exact_for_every_int8_and_layout(start_dim):
    # the oneDNN guards' weight bounds: |-128| must count 128 (int8 abs leaves it -128)
    gen = torch.Generator().manual_seed(4)
    w = torch.randint(-128, 128, (6, 5, 3, 2), dtype=torch.int8, generator=gen)
    w[0] = -128
    want = w.long().abs().sum(dim=tuple(range(start_dim, 4)))
    for name, wl in layouts(w):
        got = onednn.abs_sums(wl, start_dim)
        assert got.dtype == torch.int32 and torch.equal(got.long(), want), name
