"""The common INT8 quantizer (docs/methods.md; UI8 eq. 1-3, DAIQ eq. 1-2)."""

import pytest
import torch

from repro.quant import NonFiniteError, absmax, dequantize, quantize


def test_values_and_clamping_by_hand():
    x = torch.tensor([-1.5, -0.25, 0.0, 0.3, 2.0])
    q = quantize(x, 1.0)
    # 127 * clamp(x, -1, 1): -127, -31.75, 0, 38.1, 127
    assert q.dtype == torch.int8
    assert q.tolist() == [-127, -32, 0, 38, 127]
    assert torch.allclose(dequantize(q, 1.0), torch.tensor([-1.0, -32 / 127, 0.0, 38 / 127, 1.0]))


def test_range_is_symmetric_127():
    x = torch.randn(10_000) * 10
    q = quantize(x, absmax(x) / 4)
    assert int(q.min()) == -127 and int(q.max()) == 127


def test_per_channel_equals_per_tensor_of_each_slice():
    x = torch.randn(2, 3, 4, 5)
    scale = torch.tensor([0.5, 1.0, 2.0])
    q = quantize(x, scale, axis=1)
    assert q.shape == x.shape
    for c in range(3):
        assert torch.equal(q[:, c], quantize(x[:, c], scale[c]))
    back = dequantize(q, scale, axis=1)
    for c in range(3):
        assert torch.allclose(back[:, c], dequantize(q[:, c], scale[c]))


def test_per_channel_absmax_shapes():
    x = torch.randn(6, 3, 2)
    assert absmax(x).shape == ()
    assert absmax(x, axis=0).shape == (6,)
    assert absmax(x, axis=-1).shape == (2,)
    assert torch.equal(absmax(x, axis=1), x.abs().amax(dim=(0, 2)))


def test_bad_scale_shape_and_rounding_are_errors():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="per-channel scale"):
        quantize(x, torch.ones(4), axis=1)
    with pytest.raises(ValueError, match="nearest, stochastic"):
        quantize(x, 1.0, rounding="up")


def test_zero_scale_quantizes_to_zero():
    x = torch.zeros(2, 3)
    x[1] = 1.0
    q = quantize(x, absmax(x, axis=0), axis=0)
    assert q[0].eq(0).all() and q[1].eq(127).all()


def test_nearest_is_deterministic():
    x = torch.randn(1000)
    assert torch.equal(quantize(x, 1.0), quantize(x, 1.0))
    # and it is the nearest code of the clipped value, whatever the generator's state
    torch.manual_seed(5)
    assert torch.equal(quantize(x, 1.0), (x.clamp(-1, 1) * 127).round().to(torch.int8))


def test_stochastic_rounding_is_unbiased_and_random():
    torch.manual_seed(0)
    x = torch.rand(500) * 2 - 1
    draws = torch.stack([dequantize(quantize(x, 1.0, rounding="stochastic"), 1.0) for _ in range(4000)])
    # One draw errs by at most 1/127 with std <= 0.5/127; the mean of 4000 has std <= 6e-5.
    assert (draws.mean(0) - x).abs().max() < 4e-4
    # ...while a single draw is not the nearest value everywhere (it really is random)
    assert not torch.equal(draws[0], dequantize(quantize(x, 1.0), 1.0))
    assert (draws - x).abs().max() <= 1 / 127 + 1e-6


def test_stochastic_repeats_with_a_seeded_generator():
    x = torch.randn(100)
    a = quantize(x, 2.0, rounding="stochastic", generator=torch.Generator().manual_seed(3))
    b = quantize(x, 2.0, rounding="stochastic", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_raises_the_divergence_error(bad):
    x = torch.randn(10)
    x[3] = bad
    with pytest.raises(NonFiniteError):
        quantize(x, 1.0, rounding="stochastic")


def test_dequantize_scales_per_tensor_and_per_channel_and_names_a_bad_scale():
    q = torch.tensor([[127, -64], [0, 127]], dtype=torch.int8)
    want = torch.tensor([[2.0, -128 / 127], [0.0, 2.0]])
    torch.testing.assert_close(dequantize(q, 2.0), want)
    torch.testing.assert_close(dequantize(q, torch.tensor(2.0), axis=1), want)  # a 0-d scale: per tensor
    per_channel = dequantize(q, torch.tensor([1.0, 4.0]), axis=1)
    torch.testing.assert_close(per_channel, torch.tensor([[1.0, -256 / 127], [0.0, 4.0]]))
    assert dequantize(q, torch.tensor(1.0, dtype=torch.float64)).dtype == torch.float32
    with pytest.raises(ValueError, match=r"needs one scale, got shape \(2,\)"):
        dequantize(q, torch.tensor([1.0, 4.0]))


def test_the_divergence_error_names_the_tensor_and_its_shape():
    from repro.quant import check_finite

    with pytest.raises(NonFiniteError, match=r"non-finite values in tensor of shape \(2, 3\)"):
        check_finite(torch.full((2, 3), float("nan")))
    with pytest.raises(NonFiniteError, match=r"in activations of shape \(1,\)"):
        check_finite(torch.tensor([float("inf")]), "activations")
