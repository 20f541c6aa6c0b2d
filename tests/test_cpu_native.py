"""The CPU backend's native code (kernels/cpu/csrc): the fused quantizer against the reference semantics and
the shared Philox stream, the dequantizing epilogue, and the exact int8 GEMM; the one backend interface."""

from __future__ import annotations

import functools
import math

import numpy as np
import philox_mirror
import pytest
import torch

import kernels
from kernels import backend, cpu, reference
from kernels.cpu import native, runtime
from kernels.cpu import quantizer as cpu_quantize
from kernels.errors import NonFiniteError

# Only a machine without a compiler skips: where g++ exists the library must build, and a source that
# does not compile fails test_the_native_library_builds_where_a_compiler_exists (and every test here).
pytestmark = pytest.mark.skipif(
    runtime.compiler() is None, reason="no C++ compiler (g++, $CXX): the torch fallback runs"
)


@pytest.fixture(params=["tiles", "vector"])
def gemm_kernel(request):
    """Each GEMM test on both of the native GEMM's kernels: the tile GEMM (gemm_amx.cpp: AMX tiles, or AVX-512
    VNNI on the same packed tiles, where built and allowed) and the vector one (gemm.cpp), which such a
    machine would otherwise never run."""
    if request.param == "tiles" and not native.allow_amx(True):
        pytest.skip("no tile GEMM here (neither AMX nor AVX-512 VNNI)")
    native.allow_amx(request.param == "tiles")
    cpu.clear_route_caches()
    yield request.param
    native.allow_amx(True)
    cpu.clear_route_caches()


def test_the_native_library_builds_where_a_compiler_exists():
    runtime.build()  # raises NativeBuildError with the compiler's own output
    assert runtime.available()


def test_a_source_that_does_not_compile_fails_loudly(monkeypatch, tmp_path):
    broken = tmp_path / "src"
    broken.mkdir()
    for name in runtime.SOURCES + runtime.HEADERS:
        (broken / name).write_text((runtime.SOURCE_DIR / name).read_text())
    (broken / runtime.SOURCES[0]).write_text("this is not C++;\n")
    monkeypatch.setattr(runtime, "SOURCE_DIR", broken)
    monkeypatch.setenv("REPRO_NATIVE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(runtime.NativeBuildError, match="failed"):
        runtime.build()
    assert not list((tmp_path / "cache").glob("*.so*")), "a failed build left a file in the cache"


LAYOUTS = {
    "nchw": lambda t: t,
    "channels-last": lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t,
    "channels-last-3d": lambda t: t.contiguous(memory_format=torch.channels_last_3d) if t.dim() == 5 else t,
    "transposed": lambda t: t.t().contiguous().t() if t.dim() == 2 else t,
    # rows contiguous, but one row after the other in memory is not the next one in index order
    "rows-permuted": lambda t: t.transpose(0, 1).contiguous().transpose(0, 1) if t.dim() >= 3 else t,
}
SHAPES = [
    (37,),
    (),
    (4, 9),
    (300, 2),
    (33, 1000),
    (2, 5, 4, 3),
    (4, 16, 9, 11),
    (3, 24, 7, 7),
    (2, 40, 3, 5),  # channels-last: a 32-channel block (16-lane Philox where built) and an 8-lane one
    (2, 12, 3, 5, 6),
    (1, 72, 2, 3, 2),
    (1, 2084, 1, 5),  # channels-last: two noise chunks (2048 channels and 36) and an 8-lane tail of 4
    (3, 5, 40, 28),  # NCHW rows of 28 (7 Philox calls), blocks of 146 rows where built with 16 lanes
    (2, 3, 5, 100),  # NCHW rows of 100: 25 calls a row, more than the 16 lanes of a vector
]


def reference_codes(x, s, axis, u=None):
    """repro.quant's semantics in plain torch ops: inv = 127 / s (torch: s.reciprocal() * 127)."""
    s = torch.as_tensor(s, dtype=torch.float32)
    if axis is not None:
        s = s.reshape([-1 if d == axis % x.dim() else 1 for d in range(x.dim())])
    inv = torch.where(s > 0, 127 / s.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(s))
    v = (x.float() * inv).clamp_(-127, 127)
    v = v.round_() if u is None else v.add_(u).floor_().clamp_(-127, 127)
    return v.to(torch.int8)


def reference_absmax(x, axis):
    if axis is None:
        return x.float().abs().amax()
    dims = [d for d in range(x.dim()) if d != axis]
    return x.float().abs().amax(dim=dims) if dims else x.float().abs()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_quantize_matches_the_reference_and_the_shared_stream(shape, layout, dtype):
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=gen) * 3
    if x.numel() > 2:
        x.view(-1)[1] = 0.0
    x = LAYOUTS[layout](x.to(dtype))
    for axis in [None, *range(x.dim())]:
        s = cpu.absmax(x, axis)
        assert torch.equal(s, reference_absmax(x, axis))
        q = cpu.quantize(x, s, axis)
        assert q.dtype == torch.int8 and q.shape == x.shape and (q.stride() == x.stride() or q.dim() < 2)
        assert torch.equal(q, reference_codes(x, s, axis)), f"nearest, axis {axis}"
        qs = cpu.quantize(x, s * 0.5, axis, "stochastic", generator=torch.Generator().manual_seed(9))
        k0, k1 = kernels.rng.next_key(torch.Generator().manual_seed(9))
        u = torch.from_numpy(philox_mirror.uniforms(shape, k0, k1)).reshape(shape)
        assert torch.equal(qs, reference_codes(x, s * 0.5, axis, u)), f"stochastic, axis {axis}"


def test_nearest_ties_round_half_to_even_and_the_reciprocal_rounding():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 200.0, -200.0])
    assert cpu.quantize(x, 127.0).tolist() == [0, 2, 2, 0, -2, -2, 126, -126, 127, -127]
    # 127 / s evaluated as s.reciprocal() * 127 (two roundings): x * inv lands just below -63.5 here
    x = torch.tensor([-1.8671875], dtype=torch.bfloat16)
    assert cpu.quantize(x, torch.tensor(3.734375)).item() == int(reference_codes(x, 3.734375, None))


def test_native_standard_deviation_is_the_quantizers_formula():
    # channels of mean 0, of mean 3e4 (E[x^2] - E[x]^2 cancels), constant ones (0.7: the float sums make the
    # variance negative, clamped to 0)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(64, 40, generator=gen) * torch.linspace(0, 2, 40) + torch.tensor([0.0, 3e4] * 20)
    x[:, 6], x[:, 7] = 1.0, 0.7
    amax = torch.empty(40)
    s1, s2 = torch.empty(40, dtype=torch.float64), torch.empty(40, dtype=torch.float64)
    sd = torch.empty(40)
    lib = runtime.library()
    ptr = runtime.pointer
    assert not lib.rq_channel_stats(ptr(x), 0, 64, 40, 1, ptr(amax), ptr(s1), ptr(s2), ptr(sd))
    assert (s2 / 64 - (s1 / 64) ** 2)[7] < 0 and sd[7] == 0
    assert torch.equal(sd, cpu_quantize._sigma(s1, s2, 64))
    assert torch.equal(cpu.channel_stats(x, 1)[1], sd)


def test_stochastic_codes_at_the_top_stay_127():
    # 127 + u rounds up to 128 in float32 for u >= 1 - 2^-18; the vector code leaves that to the int8 store's
    # saturation, which must give the clamp's 127 (never -128). 2^20 elements hold a few such u.
    shape = (4, 64, 64, 64)
    k0, k1 = kernels.rng.next_key(torch.Generator().manual_seed(3))
    u = torch.from_numpy(philox_mirror.uniforms(shape, k0, k1)).reshape(shape)
    top = u >= 1 - 2.0**-18
    assert top.any()  # the case is exercised
    x = torch.full(shape, 1000.0)  # x / s * 127 clamps to 127 exactly
    x[0, 0, 0, :8] = -1000.0
    for make in LAYOUTS.values():
        q = cpu.quantize(make(x), 1.0, rounding="stochastic", generator=torch.Generator().manual_seed(3))
        assert torch.equal(q, torch.where(x > 0, 127, -127).to(torch.int8))


def test_stochastic_rounding_is_unbiased_on_both_vector_paths():
    torch.manual_seed(0)
    for make in (lambda t: t, lambda t: t.contiguous(memory_format=torch.channels_last)):
        x = make(torch.rand(4, 16, 8, 8) * 2 - 1)
        v = x * 127
        draws = torch.stack([cpu.quantize(x, 1.0, rounding="stochastic").double() for _ in range(400)])
        assert ((draws == v.floor()) | (draws == v.ceil())).all()
        # the mean of 400 Bernoulli draws: z-scores of a standard normal (4096 of them: max |z| ~ 4)
        frac = (v - v.floor()).double()
        z = (draws.mean(0) - v.double()) / (frac * (1 - frac) / 400).sqrt().clamp_min(1e-6)
        assert z.abs().max() < 6 and abs(float(z.mean())) < 0.2 and 0.8 < float(z.std()) < 1.2


# rows of 5 (short), and of 150 in NCHW: 128 elements on 16-lane blocks where built, then 8-lane, then a tail
@pytest.mark.parametrize("shape", [(6, 40, 7, 5), (2, 6, 3, 150)], ids=str)
def test_statistics_and_counts(shape):
    gen = torch.Generator().manual_seed(1)
    for make in LAYOUTS.values():
        x = make(torch.randn(*shape, generator=gen) * 2 + 0.4)
        for axis in (1, 3):  # constant along an NCHW row, and along it
            n = shape[axis]
            flat = x.movedim(axis, 0).reshape(n, -1)
            amax, sigma = cpu.channel_stats(x, axis)
            assert torch.equal(amax, flat.abs().amax(1))
            torch.testing.assert_close(sigma, flat.std(1, correction=0), rtol=1e-5, atol=0)
            for rounding in ("nearest", "stochastic"):
                _, counts = cpu.quantize(x, amax.max(), None, rounding, above=(axis, sigma))
                assert torch.equal(counts, (flat.abs() > sigma[:, None]).sum(1))
        amax0, sigma0 = cpu.channel_stats(x, None)
        assert amax0.shape == () and torch.equal(amax0, x.abs().max())
        torch.testing.assert_close(sigma0, x.std(correction=0), rtol=1e-5, atol=0)
        for rounding in ("nearest", "stochastic"):
            _, count = cpu.quantize(x, amax0, None, rounding, above=(None, sigma0))
            assert count.tolist() == [int((x.abs() > sigma0).sum())]


@pytest.mark.parametrize(
    "shape,axis",
    [((3, 20, 4, 5), 1), ((6, 20, 3, 3), 0), ((3, 20, 8, 9), 1)],  # runs of one scale < 64, 180, 72 long
)
def test_dequantize_epilogue(shape, axis):
    gen = torch.Generator().manual_seed(2)
    acc = torch.randint(-(2**24), 2**24, shape, generator=gen, dtype=torch.int32)
    scale = torch.rand(shape[axis], generator=gen) + 0.01
    per_channel = [1, 1, 1, 1]
    per_channel[axis] = -1
    for make in LAYOUTS.values():
        a = make(acc)
        for dtype in (torch.float32, torch.bfloat16):
            for ax, s in ((None, scale[0]), (axis, scale)):
                want = (a.float() * (s if ax is None else s.reshape(per_channel))).to(dtype)
                got = cpu.dequantize(a.clone(), s, ax, dtype)
                assert got.dtype == dtype and got.stride() == a.stride() and torch.equal(got, want)
    owned = acc.clone()
    out = cpu.dequantize(owned, 0.5, inplace=True)
    assert out.data_ptr() == owned.data_ptr() and torch.equal(out, acc.float() * 0.5)


def test_bfloat16_epilogue_rounds_ties_to_even():
    """The vectorised bfloat16 rounding: ties (low 16 bits 0x8000) go to the even neighbour, values past
    bfloat16's range to infinity, as torch's .to(bfloat16); in the vector body and the scalar tail alike."""
    base = [2**23 + 0x8000, 2**23 + 0x18000, 2**23 + 0x7FFF, 2**23 + 0x8001, 0, 1, -1, 2**31 - 1]
    acc = torch.tensor(base + [-v for v in base[:4]] + base[:3], dtype=torch.int32)  # 15: 8 + 7 in the tail
    for scale in (1.0, 2.0**100, 2.0**-100):
        want = (acc.float() * scale).to(torch.bfloat16)
        got = cpu.dequantize(acc, scale, dtype=torch.bfloat16)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), scale


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_raises_at_once(bad):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 8, 5, 5).to(dtype).contiguous(memory_format=torch.channels_last)
        x[1, 3, 2, 2] = bad
        for call in (
            lambda x=x: cpu.absmax(x),
            lambda x=x: cpu.absmax(x, 1),
            lambda x=x: cpu.channel_stats(x, 1),
            lambda x=x: cpu.quantize(x, 1.0),
            lambda x=x: cpu.quantize(x, 1.0, rounding="stochastic"),
        ):
            with pytest.raises(NonFiniteError):
                call()
    # NCHW rows of 150 (a 16-lane block where built, and the 8-lane code after it) and of 28 (blocks of rows)
    for width, j in ((150, 100), (150, 140), (28, 20)):
        x = torch.randn(2, 3, 4, width)
        x[1, 2, 3, j] = bad
        with pytest.raises(NonFiniteError):
            cpu.quantize(x, 1.0, rounding="stochastic")
    with pytest.raises(NonFiniteError):
        cpu.quantize(torch.ones(3), float("nan"))


def test_torch_fallback_has_the_same_nearest_codes(monkeypatch):
    x = torch.randn(4, 16, 6, 6).contiguous(memory_format=torch.channels_last)
    want = cpu.quantize(x, cpu.absmax(x, 1), 1)
    monkeypatch.setattr(runtime, "library", lambda: None)
    assert torch.equal(cpu_quantize.quantize(x, cpu_quantize.absmax(x, 1), 1), want)


@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_torch_fallback_agrees_with_the_native_code(monkeypatch, axis, layout):
    """Without a compiler the quantizer runs in torch ops: the same max, statistics, nearest codes, counts
    above the thresholds and epilogue; stochastic codes from another noise stream, but floor or ceil."""
    gen = torch.Generator().manual_seed(7)
    x = LAYOUTS[layout](
        torch.randn(4, 16, 6, 6, generator=gen) * torch.linspace(0.5, 3, 16).view(1, -1, 1, 1)
    )
    acc = LAYOUTS[layout](torch.randint(-(2**20), 2**20, (4, 16, 6, 6), generator=gen, dtype=torch.int32))

    def run():
        amax = cpu_quantize.absmax(x, axis)
        stats = cpu_quantize.channel_stats(x, axis)
        codes, counts = cpu_quantize.quantize(x, amax, axis, "nearest", above=(axis, stats[1]))
        noisy = cpu_quantize.quantize(x, amax, axis, "stochastic", generator=torch.Generator().manual_seed(1))
        outs = [
            cpu_quantize.dequantize(acc.clone(), amax, axis, dtype)
            for dtype in (torch.float32, torch.bfloat16)
        ]
        return amax, stats, codes, counts, noisy, outs

    want = run()
    monkeypatch.setattr(runtime, "library", lambda: None)
    got = run()
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1][0], want[1][0]) and torch.allclose(got[1][1], want[1][1], rtol=1e-5)
    assert torch.equal(got[2], want[2]) and torch.equal(got[3].reshape(-1), want[3].reshape(-1))
    v = reference_codes(x, want[0], axis).float()  # nearest; the noisy codes are within one step of it
    assert (got[4].float() - v).abs().max() <= 1 and not torch.equal(got[4], want[2])
    for a, b in zip(got[5], want[5], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    for call in (lambda: cpu_quantize.absmax(bad, axis), lambda: cpu_quantize.channel_stats(bad, axis),
                 lambda: cpu_quantize.quantize(bad, want[0], axis)):  # fmt: skip
        with pytest.raises(NonFiniteError):
            call()


@pytest.mark.parametrize(
    "m,k,n",
    # (61, 1601, 47) and (97, 770, 24): every remainder of the 6 x 16 register tile, partial panels on both
    # packing paths, and a reduction cut into equal blocks
    [
        (1, 1, 1),
        (7, 3, 5),
        (13, 33, 17),
        (50, 513, 40),
        (130, 1025, 200),
        (9, 5000, 7),
        (61, 1601, 47),
        (97, 770, 24),
    ],
)
def test_native_gemm_is_exact_for_every_operand_layout(gemm_kernel, m, k, n):
    gen = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
    b = torch.randint(-127, 128, (k, n), generator=gen, dtype=torch.int8)
    a[0] = 127
    b[:, 0] = -127
    want = (a.long() @ b.long()).to(torch.int32)
    for aa in (a, a.t().contiguous().t()):
        for bb in (b, b.t().contiguous().t()):
            assert torch.equal(native.gemm(aa, bb), want)
    # with a scale: the epilogue's arithmetic, float32(acc) * scale, written by the GEMM's last K block
    scale = torch.tensor([0.37], dtype=torch.float32)
    assert torch.equal(native.gemm(a.t().contiguous().t(), b, scale=scale), want.to(torch.float32) * scale)
    # bfloat16: that float32 value rounded to nearest even, as the epilogue's bfloat16 form rounds it
    got = native.gemm(a, b.t().contiguous().t(), scale=scale, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, cpu.dequantize(want, scale, dtype=torch.bfloat16))
    # an operand with no unit stride (every third column): read element by element
    wide = torch.randint(-127, 128, (m, 3 * k), generator=gen, dtype=torch.int8)
    assert torch.equal(native.gemm(wide[:, ::3], b), (wide[:, ::3].long() @ b.long()).to(torch.int32))


def test_native_gemm_splits_a_long_reduction_exactly(gemm_kernel):
    """K = 40,000 with a small output: the threads take ranges of K and add their int32 partial sums."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (24, 40_000), generator=gen, dtype=torch.int8)
    b = torch.randint(-127, 128, (40_000, 16), generator=gen, dtype=torch.int8)
    want = (a.long() @ b.long()).to(torch.int32)
    assert torch.equal(native.gemm(a, b), want)
    assert torch.equal(native.gemm(a.t().contiguous().t(), b), want)


def test_native_gemm_is_exact_at_the_codes_extremes_and_wraps_as_int32(gemm_kernel):
    """-128 and 127 in both operands (the VNNI kernel multiplies b + 128 and takes 128 times A's row sums
    off), and sums past 2^31 (K = 140,000 of 127 * 127), which wrap as int32 arithmetic does
    (kernels.reference's contract), on both kernels and both A layouts."""
    gen = torch.Generator().manual_seed(5)
    k = 140_000
    a = torch.randint(-128, 128, (33, k), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (k, 40), generator=gen, dtype=torch.int8)
    a[:2], b[:, :2] = 127, 127  # C[:2, :2] = 127^2 K > 2^31
    a[2], b[:, 2] = -128, -128
    a[3], b[:, 3] = -128, 127
    wide = a.long() @ b.long()
    assert int(wide.max()) >= 2**31
    want = ((wide + 2**31) % 2**32 - 2**31).to(torch.int32)
    assert torch.equal(native.gemm(a, b), want)
    assert torch.equal(native.gemm(a.t().contiguous().t(), b), want)


def test_cpu_route_without_vnni(monkeypatch):
    """Where torch's int8 kernels are scalar loops (no VNNI), the native GEMM serves every product."""
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    cpu.clear_route_caches()
    try:
        assert not cpu.torch_int8_fast() and not cpu.routes.onednn_exact.__wrapped__()
        gen = torch.Generator().manual_seed(5)
        x = torch.randint(-127, 128, (2, 8, 9, 9), generator=gen, dtype=torch.int8)
        w = torch.randint(-127, 128, (6, 8, 3, 3), generator=gen, dtype=torch.int8)
        assert torch.equal(cpu.conv_forward(x, w, 2, 1), reference.conv_forward(x, w, 2, 1))
    finally:
        cpu.clear_route_caches()


@pytest.mark.parametrize("module", ["cpu", "cuda", "reference_products"])
def test_every_backend_implements_the_interface(module):
    if module == "reference_products":
        products = [n for n in backend.REQUIRED if n.startswith(("conv", "linear"))]
        assert all(callable(getattr(reference, n)) for n in products)
        return
    import importlib

    assert backend.missing(importlib.import_module(f"kernels.{module}")) == []


def test_philox_mirror_of_the_tests_is_the_shared_stream():
    """The mirror's first words equal a direct Philox call (the element -> counter mapping)."""
    u = philox_mirror.uniforms((2, 5), 7, 11)
    w = philox_mirror.philox4x32_10([1, 0, 1, 0], [7, 11])  # row 1, columns 4..7
    assert u[1, 4] == np.float32((w[0] >> 8) * 2.0**-24)


@pytest.mark.parametrize("c", [16, 40, 56])  # the 16-channel vectors and a scalar tail
@pytest.mark.parametrize(
    "k,s,p,d,hw",  # hw (2, 2) and padding 3: no output column has all its taps inside (borders only)
    [(3, 1, 1, 1, (11, 9)), (3, 2, 1, 1, (11, 9)), (5, 2, 2, 1, (11, 9)), (3, 1, 2, 2, (11, 9)),
     (3, 2, 0, 1, (11, 9)), (3, 2, 3, 2, (11, 9)), (3, 1, 1, 1, (2, 2)), (3, 1, 3, 1, (5, 4))],
)  # fmt: skip
def test_native_depthwise_is_exact(monkeypatch, c, k, s, p, d, hw):
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    cpu.clear_route_caches()
    try:
        gen = torch.Generator().manual_seed(c + k + s + p + d)
        x = torch.randint(-127, 128, (3, c, *hw), generator=gen, dtype=torch.int8)
        w = torch.randint(-127, 128, (c, 1, k, k), generator=gen, dtype=torch.int8)
        y = reference.conv_forward(x, w, s, p, d, c)
        g = torch.randint(-127, 128, y.shape, generator=gen, dtype=torch.int8)
        scale = torch.tensor(1.7e-5, dtype=torch.float32)
        for xx in (x, x.contiguous(memory_format=torch.channels_last)):
            assert torch.equal(cpu.conv_forward(xx, w, s, p, d, c), y)
            want = reference.conv_input_grad(g, w, x.shape, s, p, d, c)
            assert torch.equal(cpu.conv_input_grad(g, w, x.shape, s, p, d, c), want)
            # the scaled input gradient (each stride phase gathers only its own taps) is the epilogue's
            got = cpu.conv_input_grad(g, w, x.shape, s, p, d, c, out_scale=scale)
            assert torch.equal(got.view(torch.int32), cpu.dequantize(want, scale).view(torch.int32))
            want = reference.conv_weight_grad(x, g, w.shape, s, p, d, c)
            assert torch.equal(cpu.conv_weight_grad(xx, g, w.shape, s, p, d, c), want)
    finally:
        cpu.clear_route_caches()


@pytest.mark.parametrize("stride", [1, 2])
def test_native_depthwise_outputs_of_8_mb_are_the_epilogues(monkeypatch, stride):
    """Scaled depthwise outputs of 8 MB and more go out by non-temporal stores (csrc/depthwise.cpp): bit for
    bit the int32 product (plain stores) followed by the epilogue."""
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    cpu.clear_route_caches()
    try:
        gen = torch.Generator().manual_seed(stride)
        shape = (32, 64, 32 * stride, 32 * stride)
        x = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8).contiguous(
            memory_format=torch.channels_last
        )
        w = torch.randint(-127, 128, (64, 1, 3, 3), generator=gen, dtype=torch.int8)
        g = torch.randint(-127, 128, (32, 64, 32, 32), generator=gen, dtype=torch.int8)
        g = g.contiguous(memory_format=torch.channels_last)
        scale = torch.tensor(1.7e-5, dtype=torch.float32)
        geometry = (stride, 1, 1, 64)
        for got, acc in [
            (cpu.conv_forward(x, w, *geometry, out_scale=scale), cpu.conv_forward(x, w, *geometry)),
            (
                cpu.conv_input_grad(g, w, x.shape, *geometry, out_scale=scale),
                cpu.conv_input_grad(g, w, x.shape, *geometry),
            ),
        ]:
            assert got.numel() * 4 >= 8 << 20
            assert torch.equal(got.view(torch.int32), cpu.dequantize(acc, scale).view(torch.int32))
    finally:
        cpu.clear_route_caches()


def test_depthwise_forward_takes_the_native_kernel_where_onednn_is_exact(monkeypatch):
    """On a VNNI or AMX CPU the other convolutions go to oneDNN; a depthwise forward pass goes to the native
    kernel as its gradients do (oneDNN's int8 depthwise took 1.4x the native one's time, docs/kernels.md)."""
    if not runtime.available():
        pytest.skip("the native library is not built here")
    monkeypatch.setattr(cpu.routes, "onednn_exact", lambda: True)
    monkeypatch.delenv("REPRO_CPU_GEMM", raising=False)
    calls = []
    for name in ("depthwise_forward", "depthwise_input_grad", "depthwise_weight_grad"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-127, 128, (2, 24, 9, 9), generator=gen, dtype=torch.int8)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randint(-127, 128, (24, 1, 3, 3), generator=gen, dtype=torch.int8)
    y = cpu.conv_forward(x, w, 1, 1, 1, 24)
    assert torch.equal(y, reference.conv_forward(x, w, 1, 1, 1, 24))
    g = torch.randint(-127, 128, y.shape, generator=gen, dtype=torch.int8)
    cpu.conv_input_grad(g, w, x.shape, 1, 1, 1, 24)
    cpu.conv_weight_grad(x, g, w.shape, 1, 1, 1, 24)
    assert calls == ["depthwise_forward", "depthwise_input_grad", "depthwise_weight_grad"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_absmax_of_a_large_tensor_anywhere_in_it(dtype):
    # past the native code's parallel threshold, with a length that leaves a scalar tail: the maximum and a
    # non-finite value at the start, in the middle (either thread's part), in the last vector and in the tail
    n = 3 * 32768 + 29
    for where in (0, n // 2 + 3, n - 40, n - 1):
        x = (torch.rand(n, generator=torch.Generator().manual_seed(where)) - 0.5).to(dtype)
        x[where] = -7.5
        got = cpu.absmax(x)
        assert got.item() == 7.5 and torch.equal(got, x.float().abs().max())
        for bad in (float("nan"), float("inf"), -float("inf")):
            y = x.clone()
            y[where] = bad
            with pytest.raises(NonFiniteError):
                cpu.absmax(y)


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


@pytest.mark.parametrize(
    "n,cin,cout,spatial",
    [
        (2, 3, 5, (7, 8)),
        (1, 17, 40, (1, 1)),
        (3, 40, 9, (5,)),
        (2, 1, 16, (3, 1, 2)),
        (64, 24, 6, (1, 1)),
        (32, 64, 64, (32, 32)),  # scaled outputs of 8 MB: the GEMM's non-temporal stores (csrc/gemm.cpp)
    ],
    ids=str,
)
def test_native_pointwise_products_are_exact(monkeypatch, gemm_kernel, n, cin, cout, spatial):
    """1x1 convolutions (stride 1, no padding, ungrouped) on the native route are one GEMM each
    (products._pointwise_*). Every pass equals the reference bit for bit; with out_scale, the reference
    followed by the epilogue. The results have the general path's strides and view-ness (autograd adds
    gradients into views and plain tensors differently), for channels-last operands, a batch slice of them,
    and NCHW ones (the general path)."""
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    cpu.clear_route_caches()
    calls = []
    real = native.gemm_rows
    monkeypatch.setattr(native, "gemm_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    try:
        gen = torch.Generator().manual_seed(n + cin + cout)
        x = torch.randint(-127, 128, (n + 1, cin, *spatial), generator=gen, dtype=torch.int8)
        w = torch.randint(-127, 128, (cout, cin, *(1,) * len(spatial)), generator=gen, dtype=torch.int8)
        g = torch.randint(-127, 128, (n + 1, cout, *spatial), generator=gen, dtype=torch.int8)
        x[0], g[0] = 127, -127
        scale = torch.tensor(3.0e-5, dtype=torch.float32)
        for lay in ("cl", "cl-slice", "nchw"):
            xx, ww, gg = (x[:n], w, g[:n]) if lay == "nchw" else (_cl(x)[:n], _cl(w), _cl(g)[:n])
            xx, gg = (xx, gg) if lay != "cl-slice" else (_cl(x)[1:], _cl(g)[1:])
            xr, gr = xx.contiguous(), gg.contiguous()
            want = {
                "forward": reference.conv_forward(xr, w),
                "input grad": reference.conv_input_grad(gr, w, xr.shape),
                "weight grad": reference.conv_weight_grad(xr, gr, w.shape),
            }
            calls.clear()
            got = {
                "forward": cpu.conv_forward(xx, ww),
                "input grad": cpu.conv_input_grad(gg, ww, xx.shape),
                "weight grad": cpu.conv_weight_grad(xx, gg, ww.shape),
            }
            if lay != "nchw":
                assert len(calls) == 3, lay
            elif math.prod(spatial) > 1 and min(cin, cout) > 1:
                assert not calls  # not channels-last: the general path
            scaled = {
                "forward": cpu.conv_forward(xx, ww, out_scale=scale),
                "input grad": cpu.conv_input_grad(gg, ww, xx.shape, out_scale=scale),
            }
            with monkeypatch.context() as m:
                m.setattr(cpu.products, "_pointwise", lambda *a: False)
                general = {
                    "forward": cpu.conv_forward(xx, ww),
                    "input grad": cpu.conv_input_grad(gg, ww, xx.shape),
                    "weight grad": cpu.conv_weight_grad(xx, gg, ww.shape),
                }
                general_scaled = {
                    "forward": cpu.conv_forward(xx, ww, out_scale=scale),
                    "input grad": cpu.conv_input_grad(gg, ww, xx.shape, out_scale=scale),
                }
            for what, y in got.items():
                assert y.dtype == torch.int32 and torch.equal(y, want[what]), (lay, what)
                assert y.stride() == general[what].stride(), (lay, what)
                assert y._is_view() == general[what]._is_view(), (lay, what)
            bf16 = torch.bfloat16
            for what, y in {
                "forward": cpu.conv_forward(xx, ww, out_scale=scale, out_dtype=bf16),
                "input grad": cpu.conv_input_grad(gg, ww, xx.shape, out_scale=scale, out_dtype=bf16),
            }.items():  # written by the GEMM itself, rounded as the epilogue rounds
                assert y.dtype == bf16 and torch.equal(y, cpu.dequantize(want[what], scale, dtype=bf16))
            for what, y in scaled.items():
                assert y.dtype == torch.float32, (lay, what)
                assert torch.equal(y.view(torch.int32), cpu.dequantize(want[what], scale).view(torch.int32))
                assert y.stride() == general_scaled[what].stride(), (lay, what)
                assert y._is_view() == general_scaled[what]._is_view(), (lay, what)
    finally:
        cpu.clear_route_caches()


@pytest.mark.parametrize(
    "n,cin,cout,spatial,k,s,p,d",
    [
        (2, 16, 24, (9, 7), 3, 1, 1, 1),
        (3, 32, 16, (11, 10), 3, 2, 1, 1),  # the input gradient's stride phases
        (2, 32, 32, (9, 9), 1, 2, 0, 1),  # 1x1, stride 2: one phase has taps, the others stay zero
        (2, 32, 16, (2, 2), 3, 2, 1, 1),  # a 1x1 g: each phase's window one position per image
        (2, 16, 32, (12, 11), 5, 3, 2, 1),  # stride 3: nine phases of different sizes and paddings
        (2, 16, 40, (8, 8), 3, 1, 2, 2),
        (8, 16, 8, (16, 16), 3, 1, 1, 1),  # a weight gradient in the (taps * Cin, Cout) orientation
        (1, 32, 64, (3, 3), 3, 1, 1, 1),  # ... and in the wide one, (Cout, taps * Cin)
        (2, 48, 16, (13,), 5, 1, 2, 1),
        (1, 16, 16, (4, 5, 3), 3, 1, 1, 1),
        (2, 24, 16, (6, 6), 3, 1, 1, 1),  # 24 channels: the copied columns (not a multiple of 16)
        (2, 32, 16, (1, 1), 3, 1, 1, 1),  # a 1x1 map, whose strides fit NCHW too: padded channels-last
        (2, 64, 24, (5, 20), 3, 1, 1, 1),  # AMX: 16 pixels of one image row read in place, others packed
    ],
    ids=str,
)
def test_native_implicit_im2col_products_are_exact(
    monkeypatch, gemm_kernel, n, cin, cout, spatial, k, s, p, d
):
    """Ungrouped convolutions whose channels are a multiple of 16 run one native GEMM that reads the padded
    input itself (im2col.implicit_columns, native.gemm_tables): every pass equals the reference bit for bit
    (with out_scale, the reference and the epilogue), with the strides and view-ness of the copied-columns
    path, whose GEMMs it replaces. The input gradient reads the weight itself through a table of its rows
    (products.TapMajor), without the transposed copy the other routes make; a strided one writes each phase
    straight into its positions of dx (the GEMM's row table of C)."""
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    cpu.clear_route_caches()
    calls, transposed, row_tables = [], [], []
    real = native.gemm_tables

    def spy(*a, **kw):
        calls.append(a[:3]), row_tables.append(kw.get("c_rows") is not None)
        return real(*a, **kw)

    monkeypatch.setattr(native, "gemm_tables", spy)
    real_transposed = cpu.products.tap_major_transposed
    monkeypatch.setattr(
        cpu.products, "tap_major_transposed", lambda *a: transposed.append(1) or real_transposed(*a)
    )
    nd = len(spatial)
    geo = ([s] * nd, [p] * nd, [d] * nd, 1)
    try:
        gen = torch.Generator().manual_seed(n + cin + cout + k)
        x = _cl(torch.randint(-127, 128, (n, cin, *spatial), generator=gen, dtype=torch.int8))
        w = _cl(torch.randint(-127, 128, (cout, cin, *(k,) * nd), generator=gen, dtype=torch.int8))
        x[0], w[0] = 127, -127
        xr, wr = x.contiguous(), w.contiguous()
        y = reference.conv_forward(xr, wr, *geo)
        g = _cl(torch.randint(-127, 128, y.shape, generator=gen, dtype=torch.int8))
        scale = torch.tensor(3.0e-5, dtype=torch.float32)
        want = {
            "forward": y,
            "input grad": reference.conv_input_grad(g.contiguous(), wr, x.shape, *geo),
            "weight grad": reference.conv_weight_grad(xr, g.contiguous(), w.shape, *geo),
        }

        passes = {
            "forward": lambda: cpu.conv_forward(x, w, *geo),
            "input grad": lambda: cpu.conv_input_grad(g, w, x.shape, *geo),
            "weight grad": lambda: cpu.conv_weight_grad(x, g, w.shape, *geo),
            "forward scaled": lambda: cpu.conv_forward(x, w, *geo, out_scale=scale),
            "input grad scaled": lambda: cpu.conv_input_grad(g, w, x.shape, *geo, out_scale=scale),
            "forward bf16": lambda: cpu.conv_forward(x, w, *geo, out_scale=scale, out_dtype=torch.bfloat16),
            "input grad bf16": lambda: cpu.conv_input_grad(
                g, w, x.shape, *geo, out_scale=scale, out_dtype=torch.bfloat16
            ),
        }
        got, tables_used, every_call = {}, {}, []
        for what, call in passes.items():
            calls.clear(), transposed.clear(), row_tables.clear()
            got[what] = call()
            tables_used[what] = bool(calls)
            every_call += calls
            if what.startswith("input grad"):
                assert bool(transposed) == (cout % 16 != 0), what
                assert all(written_in_place == (s > 1) for written_in_place in row_tables), what
        assert len(every_call) >= (2 if cin % 16 == 0 else 0) and (
            cin % 16 == 0 or all(c[2] % 16 == 0 for c in every_call)
        )
        # which passes read their columns in place: the forward pass and the weight gradient where x has a
        # multiple of 16 channels, the input gradient (a convolution of g) where g has
        for what, used in tables_used.items():
            assert used == ((cout if what.startswith("input grad") else cin) % 16 == 0), what
        with monkeypatch.context() as m:
            m.setattr(cpu.im2col, "implicit_ok", lambda channels: False)
            calls.clear(), transposed.clear()
            copied = {what: call() for what, call in passes.items()}
            assert not calls and len(transposed) > 0
        for what, t in got.items():
            if what.endswith("scaled"):
                expect = cpu.dequantize(want[what.removesuffix(" scaled")], scale)
                assert t.dtype == torch.float32 and torch.equal(
                    t.view(torch.int32), expect.view(torch.int32)
                ), what
            elif what.endswith("bf16"):  # rounded by the GEMM itself where it reads the columns in place
                expect = cpu.dequantize(want[what.removesuffix(" bf16")], scale, dtype=torch.bfloat16)
                assert t.dtype == torch.bfloat16 and torch.equal(t, expect), what
            else:
                assert t.dtype == torch.int32 and torch.equal(t, want[what]), what
            assert t.stride() == copied[what].stride() and t._is_view() == copied[what]._is_view(), what
    finally:
        cpu.clear_route_caches()


@pytest.mark.parametrize(
    "n,cin,cout,groups,spatial,k,s,p,d",
    [
        (2, 64, 64, 16, (7, 7), 3, 1, 1, 1),  # 4 channels a group: one block of 16 groups, 64 channels
        (2, 32, 32, 2, (9, 8), 3, 2, 1, 1),  # two groups of 16 in one block of 32 channels; stride phases
        (2, 32, 32, 2, (2, 2), 3, 2, 1, 1),  # ... of a 1x1 g: one position per image in each window
        (2, 80, 80, 5, (6, 6), 3, 1, 1, 1),  # five groups of 16: one block of 80 channels
        (3, 256, 512, 64, (5, 5), 3, 1, 1, 1),  # 4 -> 8 channels: four blocks of 16 groups
        (2, 48, 96, 3, (5, 5), 1, 1, 0, 1),  # a grouped 1x1
        (2, 64, 64, 4, (9,), 3, 1, 1, 1),  # 1-D
        (1, 32, 64, 2, (4, 4, 3), 3, 1, 1, 1),  # 3-D
        (8, 128, 128, 32, (24, 24), 3, 1, 1, 1),  # weight gradient: a long reduction, two blocks each split
        (8, 256, 256, 64, (24, 24), 3, 1, 1, 1),  # ... four blocks, whole blocks a thread
        (2, 104, 104, 13, (9, 9), 3, 2, 1, 1),  # RegNetY's 8 channels a group: AMX tiles only
        (2, 32, 64, 2, (8, 8), 2, 2, 0, 1),  # an even kernel: phases of one tap each
        (2, 32, 32, 2, (13, 13), 5, 3, 2, 1),  # a stride 3: nine phases
        (2, 64, 64, 16, (11, 11), 3, 2, 2, 2),  # dilated
    ],
    ids=str,
)
@pytest.mark.parametrize("amx_blocks", [True, False], ids=["amx-blocks", "vnni-blocks"])
def test_grouped_products_on_the_native_gemm_are_exact(
    monkeypatch, gemm_kernel, amx_blocks, n, cin, cout, groups, spatial, k, s, p, d
):
    """Grouped convolutions whose blocks of groups have a multiple of 16 input channels (im2col.group_block)
    run one native GEMM call for all blocks, each an ungrouped product with a block-diagonal weight reading
    the padded input in place: every pass equals the reference bit for bit, scaled in the GEMM's stores (one
    scale, one per output channel for the weight gradient, bfloat16) without the epilogue's pass. The input
    gradient reads the forward pass's block-diagonal operands transposed, one phase per call."""
    if not amx_blocks and gemm_kernel != "tiles":
        pytest.skip("the vector GEMM takes one rule of blocks (the tile GEMM's kind does not apply)")
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    # the blocks of either kind's rule (im2col.group_block), on whichever kernel runs here; not the direct
    # VNNI kernel (test_grouped_products_on_the_direct_vnni_kernel_are_exact)
    monkeypatch.setattr(cpu.routes, "tiles_are_amx", lambda: amx_blocks)
    monkeypatch.setattr(cpu.routes, "GROUPED_VNNI", False)
    cpu.clear_route_caches()
    batches, passes = [], []
    real = native.gemm_tables
    monkeypatch.setattr(
        native, "gemm_tables", lambda *a, **kw: batches.append(kw.get("batch")) or real(*a, **kw)
    )
    real_dequantize = cpu.products.dequantize
    monkeypatch.setattr(
        cpu.products, "dequantize", lambda *a, **kw: passes.append(1) or real_dequantize(*a, **kw)
    )
    nd = len(spatial)
    geo = ([s] * nd, [p] * nd, [d] * nd, groups)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the threads' shares of blocks and rows
    try:
        if cpu.im2col.group_block(groups, cin // groups, cout // groups) is None:
            assert cin // groups * groups % 16 != 0 and not cpu.routes.native_tiles()
            pytest.skip("runs of channels that are not a multiple of 16: the AMX GEMM's packing only")
        gen = torch.Generator().manual_seed(cin + cout + groups)
        x = _cl(torch.randint(-127, 128, (n, cin, *spatial), generator=gen, dtype=torch.int8))
        w = _cl(torch.randint(-127, 128, (cout, cin // groups, *(k,) * nd), generator=gen, dtype=torch.int8))
        x[0], w[0] = 127, -127
        xr, wr = x.contiguous(), w.contiguous()
        y = reference.conv_forward(xr, wr, *geo)
        g = _cl(torch.randint(-127, 128, y.shape, generator=gen, dtype=torch.int8))
        dx = reference.conv_input_grad(g.contiguous(), wr, x.shape, *geo)
        dw = reference.conv_weight_grad(xr, g.contiguous(), w.shape, *geo)
        scale, per_channel = torch.tensor(3.0e-5), (torch.rand(cout, generator=gen) + 0.5) * 1e-5
        assert torch.equal(cpu.conv_forward(x, w, *geo), y)
        kept = cpu.known.recall(w).block_diagonal[2]  # the forward pass's operands, for the input gradient
        made = []
        real_operands = cpu.im2col.block_diagonal
        monkeypatch.setattr(
            cpu.im2col, "block_diagonal", lambda *a: made.append(real_operands(*a)) or made[-1]
        )
        assert torch.equal(cpu.conv_input_grad(g, w, x.shape, *geo), dx)
        assert made and all(m is kept for m in made)
        assert torch.equal(cpu.conv_weight_grad(x, g, w.shape, *geo), dw)
        assert batches and all(b is not None for b in batches)
        for out_dtype in (torch.float32, torch.bfloat16):
            got = cpu.conv_forward(x, w, *geo, out_scale=scale, out_dtype=out_dtype)
            assert torch.equal(got, cpu.dequantize(y.clone(), scale, dtype=out_dtype)), out_dtype
            got = cpu.conv_input_grad(g, w, x.shape, *geo, out_scale=scale, out_dtype=out_dtype)
            assert torch.equal(got, cpu.dequantize(dx.clone(), scale, dtype=out_dtype)), out_dtype
        for sc, axis in ((scale, None), (per_channel, 0)):
            got = cpu.conv_weight_grad(x, g, w.shape, *geo, out_scale=sc)
            assert got.dtype == torch.float32 and torch.equal(got, cpu.dequantize(dw.clone(), sc, axis=axis))
        assert not passes
    finally:
        torch.set_num_threads(threads)
        cpu.clear_route_caches()


def _tile_kind(monkeypatch, amx: bool) -> None:
    """The block rules of a tile GEMM on AMX (amx) or on AVX-512 VNNI, whatever this CPU has."""
    if not cpu.im2col.implicit_ok(16):
        pytest.skip("no native GEMM route here")
    monkeypatch.setattr(cpu.routes, "native_tiles", lambda: True)
    monkeypatch.setattr(cpu.routes, "tiles_are_amx", lambda: amx)
    cpu.im2col.group_block.cache_clear()
    cpu.im2col.weight_grad_block.cache_clear()


@pytest.fixture
def fresh_blocks():
    yield
    cpu.clear_route_caches()  # no block the patched rules chose stays cached


def test_group_block_takes_whole_tiles_of_input_channels_on_amx(monkeypatch, fresh_blocks):
    """A block of groups on AMX: a divisor of the groups, input channels the packing reads as runs, at most
    128 channels either side; the smallest reaching 64 input channels, else the largest; none for ungrouped
    products or where no block fits. The weight gradient's blocks are smaller."""
    _tile_kind(monkeypatch, amx=True)
    block = cpu.im2col.group_block
    assert block(32, 4, 4) == 16  # ResNeXt's 32 x 4d: 64 channels a block
    assert block(32, 32, 32) == 2
    assert block(25, 16, 16) == 5  # RegNet's 16 channels a group: 80
    assert block(2, 16, 16) == 2  # fewer than 64 channels in all: the largest block
    assert block(4, 64, 256) is None  # 256 output channels a group: over 128
    assert block(3, 8, 8) == 3  # 24 channels: runs the tiles' packing reads with masked loads
    assert block(2, 4, 4) is None  # 8 channels: under one 16-byte run
    assert block(1, 64, 64) is None
    # the weight gradient computes a block's every product: the smallest block of 32 or more whole-run input
    # channels, or a single group of 16n; none where no block's channels fill whole runs (group_block's then)
    wgrad = cpu.im2col.weight_grad_block
    assert wgrad(32, 4, 4) == 8 and wgrad(32, 8, 8) == 4  # ResNeXt's first two stages: 32 channels
    assert wgrad(32, 16, 16) == 1 and wgrad(25, 16, 16) == 1  # 16 channels a group: one
    assert (
        wgrad(13, 8, 8) is None and wgrad(55, 8, 8) is None
    )  # RegNetY's 104 and 440 channels: no whole runs
    assert wgrad(1, 64, 64) is None


def test_group_block_on_vnni_takes_the_least_modelled_work(monkeypatch, fresh_blocks):
    """On AVX-512 VNNI the blocks are the least work of a model of the kernel's tiles (im2col._vnni_work),
    whole 16-byte runs first: the fastest block measured for these layers, or one within 1.07x of its time
    (AMD Zen 5, RegNetX/Y-400MF and ResNeXt-50 at 112 px, docs/measurements.md)."""
    _tile_kind(monkeypatch, amx=False)
    block, wgrad = cpu.im2col.group_block, cpu.im2col.weight_grad_block
    s2 = ((3, 3), (2, 2))  # a 3x3 convolution of stride 2
    assert block(25, 16, 16) == 1 and block(10, 16, 16) == 1  # RegNetX's 400 and 160 channels: single groups
    assert block(25, 16, 16, *s2) == 2 and block(4, 16, 16, *s2) == 2  # stride 2: 32 (the phases' short k)
    assert block(32, 4, 4) == 4 and block(32, 8, 8) == 2 and block(32, 32, 32) == 1  # ResNeXt's
    # RegNetY's 8-channel groups: 16 channels at stride 1 (the last block overlapping where the groups are
    # odd), 32 at stride 2, and all 48 of its first layer at stride 2
    assert block(13, 8, 8) == 2 and block(55, 8, 8) == 2 and block(13, 8, 8, *s2) == 4
    assert block(6, 8, 8) == 2 and block(6, 8, 8, *s2) == 6
    assert block(3, 8, 8) == 2  # 24 channels: whole runs of 16 first
    assert block(4, 64, 256) is None and block(2, 4, 4) is None and block(1, 64, 64) is None
    # the weight gradient: the smallest block of whole runs, overlapping where no divisor has them (a run
    # that a tile straddles is packed byte by byte)
    assert wgrad(4, 16, 16) == 1 and wgrad(25, 16, 16) == 1 and wgrad(32, 4, 4) == 4 and wgrad(6, 8, 8) == 2
    assert wgrad(55, 8, 8) == 2 and wgrad(13, 8, 8) == 2
    assert wgrad(1, 64, 64) is None
    # the model itself: 64-byte tiles, columns in 16s, rows in 8s, and each block's rows
    work = cpu.im2col._vnni_work
    assert work(25, 16, 16, 1, (3, 3), (1, 1)) < work(25, 16, 16, 5, (3, 3), (1, 1))
    assert work(13, 8, 8, 2, (3, 3), (1, 1)) == work(14, 8, 8, 2, (3, 3), (1, 1))  # 7 blocks either way
    assert work(2, 16, 16, 1, (3, 3), None) < work(2, 16, 16, 2, (3, 3), None)


@pytest.mark.parametrize(
    "n,cin,cout,groups,spatial,s,blk",
    [
        (2, 400, 400, 25, (5, 5), 1, 2),  # RegNetX's 25 groups in blocks of 2: 12, and a 13th overlapping
        (2, 104, 104, 13, (9, 9), 2, 4),  # RegNetY's 8-channel groups, stride 2: the input gradient's phases
        (2, 80, 160, 5, (6, 6), 2, 3),  # 16 input and 32 output channels a group: the last block from group 2
    ],
    ids=str,
)
def test_grouped_products_with_an_overlapping_last_block_are_exact(
    monkeypatch, gemm_kernel, n, cin, cout, groups, spatial, s, blk
):
    """Blocks that do not divide the groups (im2col.block_starts): the last block starts blk groups before
    the end and computes the groups it shares with the block before it again, to the same values. Every pass
    equals the reference bit for bit, scaled by one value and (the weight gradient) one per output channel."""
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    monkeypatch.setattr(cpu.routes, "GROUPED_VNNI", False)  # the tile GEMM's blocks
    cpu.clear_route_caches()
    if not cpu.im2col.implicit_ok(16) or not cpu.routes.native_grouped_conv(cin, cout, groups):
        pytest.skip("no native GEMM route for these groups on this kernel")
    if not cpu.im2col.table_run_ok(blk * cin // groups) or not cpu.im2col.table_run_ok(blk * cout // groups):
        pytest.skip("runs of channels that are not a multiple of 16: the tile GEMM's packing only")
    # (cached functions: clear_route_caches clears them)
    monkeypatch.setattr(cpu.im2col, "group_block", functools.cache(lambda *_: blk))
    monkeypatch.setattr(cpu.im2col, "weight_grad_block", functools.cache(lambda *_: blk))
    calls, real = [], native.gemm_tables
    monkeypatch.setattr(native, "gemm_tables", lambda *a, **kw: calls.append(kw["batch"]) or real(*a, **kw))
    try:
        gen = torch.Generator().manual_seed(groups)
        x = _cl(torch.randint(-127, 128, (n, cin, *spatial), generator=gen, dtype=torch.int8))
        w = _cl(torch.randint(-127, 128, (cout, cin // groups, 3, 3), generator=gen, dtype=torch.int8))
        x[0], w[-1] = 127, -127  # the extremes in the overlapping block
        geo = ([s] * 2, [1] * 2, [1] * 2, groups)
        y = reference.conv_forward(x.contiguous(), w.contiguous(), *geo)
        g = _cl(torch.randint(-127, 128, y.shape, generator=gen, dtype=torch.int8))
        dx = reference.conv_input_grad(g.contiguous(), w.contiguous(), x.shape, *geo)
        dw = reference.conv_weight_grad(x.contiguous(), g.contiguous(), w.shape, *geo)
        assert torch.equal(cpu.conv_forward(x, w, *geo), y)
        assert torch.equal(cpu.conv_input_grad(g, w, x.shape, *geo), dx)
        assert torch.equal(cpu.conv_weight_grad(x, g, w.shape, *geo), dw)
        assert {b[0] for b in calls} == {groups // blk, 1}  # the equally spaced blocks, then the last
        scale, per_channel = torch.tensor(3.0e-5), (torch.rand(cout, generator=gen) + 0.5) * 1e-5
        got = cpu.conv_forward(x, w, *geo, out_scale=scale, out_dtype=torch.bfloat16)
        assert torch.equal(got, cpu.dequantize(y.clone(), scale, dtype=torch.bfloat16))
        got = cpu.conv_input_grad(g, w, x.shape, *geo, out_scale=scale)
        assert torch.equal(got, cpu.dequantize(dx.clone(), scale))
        got = cpu.conv_weight_grad(x, g, w.shape, *geo, out_scale=per_channel)
        assert torch.equal(got, cpu.dequantize(dw.clone(), per_channel, axis=0))
    finally:
        cpu.clear_route_caches()


@pytest.mark.parametrize(
    "n,cin,cout,groups,spatial,k,s,p,d",
    [
        (2, 400, 400, 25, (5, 5), 3, 1, 1, 1),  # RegNetX: one group of 16 a block
        (2, 160, 160, 10, (9, 9), 3, 2, 1, 1),  # ... at stride 2: the input gradient's four phases
        (2, 104, 104, 13, (9, 9), 3, 1, 1, 1),  # RegNetY's 8 channels: two groups a block, the last overlaps
        (3, 48, 48, 6, (11, 11), 3, 2, 1, 1),  # ... stride 2
        (2, 128, 128, 32, (6, 6), 3, 1, 1, 1),  # ResNeXt's 4 channels: four groups a block
        (2, 256, 256, 8, (5, 5), 3, 1, 1, 1),  # 32 channels: two vectors of outputs
        (2, 32, 64, 2, (10, 10), 3, 1, 0, 1),  # 16 in, 32 out (the input gradient: 32 in, 16 out); no padding
        (2, 48, 72, 3, (7, 7), 3, 1, 1, 1),  # 24 outputs a group: lanes past them not written
        (2, 64, 64, 4, (13, 13), 5, 3, 2, 1),  # a stride 3: nine phases
        (2, 64, 64, 16, (11, 11), 3, 2, 2, 2),  # dilated, 4 channels a group
        (2, 400, 400, 25, (2, 2), 3, 2, 1, 1),  # 2x2 -> 1x1: a phase as large as dx, still strided
    ],
    ids=str,
)
def test_grouped_products_on_the_direct_vnni_kernel_are_exact(
    monkeypatch, n, cin, cout, groups, spatial, k, s, p, d
):
    """Grouped 2-D convolutions on AVX-512 VNNI's direct kernel (kernels/cpu/csrc/grouped.cpp): blocks of
    groups whose outputs fill a vector of 16, each pixel's codes read as code + 128 from the flipped padded
    input (the extremes included), the weight read where it lies. The forward pass and the input gradient
    (every phase, in one call) equal the reference bit for bit, as int32, float32 scaled and bfloat16, with
    no tile GEMM call."""
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    monkeypatch.setattr(cpu.routes, "tiles_are_amx", lambda: False)  # (an AMX CPU has AVX-512 VNNI too)
    cpu.clear_route_caches()
    if not cpu.routes.grouped_vnni():
        pytest.skip("no AVX-512 VNNI tile GEMM here")
    direct, tiles = [], []
    real_direct, real_tables = native.grouped_vnni, native.gemm_tables
    monkeypatch.setattr(native, "grouped_vnni", lambda *a, **kw: direct.append(1) or real_direct(*a, **kw))
    monkeypatch.setattr(native, "gemm_tables", lambda *a, **kw: tiles.append(1) or real_tables(*a, **kw))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the threads' shares of blocks and rows
    try:
        gen = torch.Generator().manual_seed(cin + cout + groups)
        x = _cl(torch.randint(-127, 128, (n, cin, *spatial), generator=gen, dtype=torch.int8))
        w = _cl(torch.randint(-127, 128, (cout, cin // groups, k, k), generator=gen, dtype=torch.int8))
        x[0], w[0], x[-1, :, -1], w[-1] = 127, -127, -127, 127
        geo = ([s] * 2, [p] * 2, [d] * 2, groups)
        y = reference.conv_forward(x.contiguous(), w.contiguous(), *geo)
        g = _cl(torch.randint(-127, 128, y.shape, generator=gen, dtype=torch.int8))
        g[0] = -127
        dx = reference.conv_input_grad(g.contiguous(), w.contiguous(), x.shape, *geo)
        # the layers' channels-last weight (packed a gather or 16 outputs a load a row), and one laid out as
        # torch's
        for wl in (w, w.contiguous()):
            assert torch.equal(cpu.conv_forward(x, wl, *geo), y)
            assert torch.equal(cpu.conv_input_grad(g, wl, x.shape, *geo), dx)
        scale = torch.tensor(3.0e-5)
        for out_dtype in (torch.float32, torch.bfloat16):
            got = cpu.conv_forward(x, w, *geo, out_scale=scale, out_dtype=out_dtype)
            assert torch.equal(got, cpu.dequantize(y.clone(), scale, dtype=out_dtype)), out_dtype
            got = cpu.conv_input_grad(g, w, x.shape, *geo, out_scale=scale, out_dtype=out_dtype)
            assert torch.equal(got, cpu.dequantize(dx.clone(), scale, dtype=out_dtype)), out_dtype
        assert len(direct) == 8 and not tiles  # every forward pass and input gradient above, one call each
    finally:
        torch.set_num_threads(threads)
        cpu.clear_route_caches()


def test_native_gemm_threads_split_rows_or_columns_exactly(gemm_kernel):
    """Two threads take ranges of rows, or of columns where B is the larger operand (N > M), and leave
    the same int32 result, scaled or not, by one scale or one a row or column. On VNNI the ranges split
    at 8 rows or 16 columns (300 rows at 152, 97 at 56, 200 columns at 112), not only at 32; a scaled C of
    4 MB and more goes out by non-temporal stores where a vector is whole and aligned (1100 x 1000: rows of
    4000 bytes, some aligned and some not)."""
    gen = torch.Generator().manual_seed(7)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for m, k, n in ((40, 700, 300), (40, 700, 200), (300, 700, 40), (97, 1500, 97), (1100, 64, 1000)):
            a = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
            b = torch.randint(-127, 128, (k, n), generator=gen, dtype=torch.int8)
            want = (a.long() @ b.long()).to(torch.int32)
            assert torch.equal(native.gemm(a, b), want)
            scale = torch.tensor([0.03], dtype=torch.float32)
            assert torch.equal(native.gemm(a, b, scale=scale), want.to(torch.float32) * scale)
            for axis, count in ((0, m), (1, n)):
                scales = torch.rand(count, generator=gen) + 0.5
                out = torch.empty(m, n)
                native.gemm_rows(m, n, k, a, k, 1, b, n, 1, out, n, scales, axis)
                along = scales.view((-1, 1) if axis == 0 else (1, -1))
                assert torch.equal(out, want.to(torch.float32) * along)
    finally:
        torch.set_num_threads(threads)


def test_native_gemm_adds_its_scaled_product_to_what_c_holds(gemm_kernel):
    """gemm_rows(add=True): C = C + acc * scale, float32's sum of the two (C's values first, as autograd adds
    two gradients), by one scale or one a row or column; on one thread and two (their row, column and K
    ranges: 9,000 k into 40 x 20 is split by K)."""
    gen = torch.Generator().manual_seed(11)
    threads = torch.get_num_threads()
    try:
        for nt in (1, 2):
            torch.set_num_threads(nt)
            for m, k, n in ((37, 70, 53), (300, 700, 40), (40, 9000, 20), (40, 700, 200)):
                a = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
                b = torch.randint(-127, 128, (k, n), generator=gen, dtype=torch.int8)
                acc = (a.long() @ b.long()).to(torch.float32)
                for axis, scale in ((-1, torch.tensor([0.01])), (0, torch.rand(m, generator=gen) + 0.5)):
                    c = torch.randn(m, n, generator=gen) * 100
                    out = c.clone()
                    native.gemm_rows(m, n, k, a, k, 1, b, n, 1, out, n, scale, axis, add=True)
                    assert torch.equal(out, c + acc * (scale if axis < 0 else scale.view(-1, 1)))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kernel, stride", [(1, 1), (3, 1), (1, 2)], ids=["1x1", "3x3", "1x1 s2"])
def test_input_grad_accumulates_into_a_gradient_as_autograd_adds(kernel, stride):
    """conv_input_grad(accumulate=r) returns r itself holding r + dx bit for bit: the 1x1 route on the tile
    GEMM adds in the product (one GEMM call, no other output), the others add after it."""
    gen = torch.Generator().manual_seed(5)
    x_shape = (2, 24, 6, 6)
    w = torch.randint(-127, 128, (32, 24, kernel, kernel), generator=gen, dtype=torch.int8)
    out = (6 + 2 * (kernel // 2) - kernel) // stride + 1
    g = torch.randint(-127, 128, (2, 32, out, out), generator=gen, dtype=torch.int8)
    g = g.contiguous(memory_format=torch.channels_last)
    scale, pad = torch.tensor(3e-4), kernel // 2
    r = torch.randn(x_shape, generator=gen).contiguous(memory_format=torch.channels_last)
    dx = cpu.conv_input_grad(g, w, x_shape, stride, pad, out_scale=scale)
    want = r + dx
    calls = []
    rows = native.gemm_rows
    native.gemm_rows = lambda *a, **kw: calls.append(kw.get("add")) or rows(*a, **kw)
    try:
        got = cpu.conv_input_grad(g, w, x_shape, stride, pad, out_scale=scale, accumulate=r)
    finally:
        native.gemm_rows = rows
    assert got is r and torch.equal(got, want)
    if kernel == 1 and stride == 1 and cpu.routes.native_tiles():
        assert calls == [True]
    with pytest.raises(ValueError):
        cpu.conv_input_grad(g, w, x_shape, stride, pad, accumulate=r)  # an int32 product


@pytest.mark.parametrize(
    "shape,p", [((2, 3, 5, 4), (1, 2)), ((1, 16, 4, 5, 3), (1, 0, 2)), ((2, 8, 7), (3,))], ids=str
)
@pytest.mark.parametrize("one_op", [True, False], ids=["one op", "border only"])
def test_pad_zero_pads_with_zeros_in_either_layout(monkeypatch, shape, p, one_op):
    """im2col.pad_zero, by one torch op (small tensors) or zeroing only the border of an uninitialised buffer:
    every border byte is 0 even where the buffer held other bytes (the allocation is filled with 0x55 here,
    as reused heap memory may be), and the layout family is kept."""
    monkeypatch.setattr(cpu.im2col, "PAD_ONE_OP_BYTES", 1 << 20 if one_op else 0)
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)
    want = torch.nn.functional.pad(x.float(), [v for b in reversed(p) for v in (b, b)]).to(torch.int8)
    real_empty = torch.empty
    for xx in (x, _cl(x)):
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(0x55))
            got = cpu.im2col.pad_zero(xx, p)
        assert torch.equal(got, want)
        assert cpu.memory.is_cl(got) == cpu.memory.is_cl(xx)


@pytest.mark.parametrize("k, s", [(1, 2), (2, 3)])
def test_input_gradient_positions_no_tap_reaches_are_written_zero(monkeypatch, k, s):
    """A strided input gradient whose phases include ones no tap reaches: those positions are 0, even where
    the allocation held other bytes. (Writing the zeros phase by phase instead of filling the whole output
    first was tried: slower, 1.07 -> 1.22 ms for 16 x 256-28-512 1x1 stride 2, Intel AMX.)"""
    gen = torch.Generator().manual_seed(k + s)
    w = _cl(torch.randint(-127, 128, (16, 32, k, k), generator=gen, dtype=torch.int8))
    x_shape = (2, 32, 9, 8)
    out = [(a - k) // s + 1 for a in x_shape[2:]]
    g = _cl(torch.randint(-127, 128, (2, 16, *out), generator=gen, dtype=torch.int8))
    want = reference.conv_input_grad(g.contiguous(), w.contiguous(), x_shape, s, 0)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(0x55))
    scale = torch.tensor(0.5)
    assert torch.equal(cpu.conv_input_grad(g, w, x_shape, s, 0), want)
    assert torch.equal(cpu.conv_input_grad(g, w, x_shape, s, 0, out_scale=scale), want.float() * scale)


def test_pad_zero_pads_a_tensor_once_until_it_changes():
    """The weight gradient reads the padded input the forward pass made: the same tensor for the same x and
    padding, a fresh one for another padding, another tensor, or x changed in place."""
    x = _cl(torch.randint(-127, 128, (2, 16, 5, 6), dtype=torch.int8))
    xp = cpu.im2col.pad_zero(x, (1, 1))
    assert cpu.im2col.pad_zero(x, (1, 1)) is xp
    other = cpu.im2col.pad_zero(x, (2, 2))
    assert other.shape[2:] == (9, 10) and torch.equal(other[:, :, 1:-1, 1:-1], xp)
    assert cpu.im2col.pad_zero(x.clone(), (1, 1)) is not xp
    x.add_(1)
    fresh = cpu.im2col.pad_zero(x, (1, 1))
    assert fresh is not xp and torch.equal(fresh[:, :, 1:-1, 1:-1], x)


@pytest.mark.parametrize("amx", [True, False])
def test_products_take_the_native_gemm_where_its_tile_gemm_runs(monkeypatch, amx):
    """With VNNI, torch's int8 kernels serve the products, except where the native tile GEMM runs (AMX, or
    AVX-512 VNNI): there the native GEMM takes the GEMMs, unless REPRO_CPU_GEMM=torch."""
    monkeypatch.delenv("REPRO_CPU_GEMM", raising=False)
    monkeypatch.setattr(cpu.routes, "torch_int8_fast", lambda: True)
    monkeypatch.setattr(cpu.routes, "native_tiles", lambda: amx)
    cpu.routes.native_gemm.cache_clear()
    assert cpu.routes.native_gemm() is amx
    monkeypatch.setenv("REPRO_CPU_GEMM", "torch")
    cpu.routes.native_gemm.cache_clear()
    assert cpu.routes.native_gemm() is False


@pytest.mark.parametrize(
    "n,cin,cout,k,stride,pad,groups,hw",
    [
        (2, 48, 40, 1, 1, 0, 1, 3),  # 1x1, the weight wider than the rows: C (Cout, Cin), a scale per row
        (4, 8, 12, 1, 1, 0, 1, 6),  # 1x1, C (Cin, Cout): a scale per column
        (2, 16, 32, 3, 1, 1, 1, 4),  # the implicit im2col's GEMM, wide
        (16, 16, 2, 3, 2, 1, 1, 8),  # the implicit im2col's GEMM, C (taps x Cin, Cout)
        (64, 16, 16, 1, 1, 0, 1, 32),  # a long reduction: the threads' partial sums added, then scaled
        (
            2,
            8,
            8,
            3,
            1,
            1,
            2,
            5,
        ),  # grouped, 4 channels a group: the general route's int32 result, then the epilogue
        (2, 32, 32, 3, 1, 1, 2, 5),  # grouped, 16 channels a group: the native GEMM's blocks of groups
        (2, 8, 8, 3, 1, 1, 8, 5),  # depthwise
    ],
    ids=str,
)
def test_weight_gradient_with_its_scale_is_the_epilogues_bit_for_bit(
    monkeypatch, gemm_kernel, n, cin, cout, k, stride, pad, groups, hw
):
    """conv_weight_grad(..., out_scale) writes (float)dw * scale in the GEMM's stores, one scale or one per
    output channel (DAIQ's GVQ), on every route and both GEMM kernels: bit for bit the int32 product then
    the epilogue (kernels.cpu.dequantize), in the same layout."""
    monkeypatch.setenv("REPRO_CPU_GEMM", "native")
    cpu.clear_route_caches()
    gen = torch.Generator().manual_seed(cin * cout + k)
    out = (hw + 2 * pad - k) // stride + 1
    x = _cl(torch.randint(-127, 128, (n, cin, hw, hw), generator=gen, dtype=torch.int8))
    g = _cl(torch.randint(-127, 128, (n, cout, out, out), generator=gen, dtype=torch.int8))
    shape = (cout, cin // groups, k, k)
    geometry = (stride, pad, 1, groups)
    acc = reference.conv_weight_grad(x.contiguous(), g.contiguous(), shape, *geometry)
    plain = cpu.conv_weight_grad(x, g, shape, *geometry)
    assert torch.equal(plain, acc)
    per_channel = (torch.rand(cout, generator=gen) + 0.5) * 1e-5
    passes = []  # the epilogue's own pass: only where the GEMM does not scale (grouped routes)
    real = cpu.products.dequantize
    monkeypatch.setattr(cpu.products, "dequantize", lambda *a, **kw: passes.append(1) or real(*a, **kw))
    for scale, axis in ((torch.tensor(3.0e-5), None), (per_channel, 0)):
        got = cpu.conv_weight_grad(x, g, shape, *geometry, out_scale=scale)
        want = cpu.dequantize(acc.clone(), scale, axis=axis)
        assert got.dtype == torch.float32 and got.stride() == plain.stride()
        assert torch.equal(got, want)
    scaled_in_stores = (
        groups == 1 or cpu.im2col.group_block(groups, cin // groups, cout // groups) is not None
    )
    assert len(passes) == (0 if scaled_in_stores else 2)
    with pytest.raises(ValueError, match="out_scale"):
        cpu.conv_weight_grad(x, g, shape, *geometry, out_scale=torch.ones(cout + 1))
