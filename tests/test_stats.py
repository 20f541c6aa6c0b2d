"""repro.stats: KS statistics and critical values against scipy.stats, d_c and DAIQ's E on hand-computed
tensors, the Inverted-T fit and D_n, the discriminator's fraction, per-slice histograms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

from repro import stats


def test_critical_values_are_the_exact_ks_quantiles():
    # n = 1: D = max(F(x), 1 - F(x)) is uniform on [1/2, 1], so P(D <= d) = 2d - 1 = 0.95 at d = 0.975
    assert stats.ks_critical(1) == pytest.approx(0.975, abs=1e-9)
    # Massey's (1951) table: n = 100 at 0.05 -> 0.134; large n -> 1.358 / sqrt(n)
    assert stats.ks_critical(100) == pytest.approx(0.1340, abs=2e-4)
    assert stats.ks_critical(100_000) == pytest.approx(1.3581 / math.sqrt(100_000), rel=1e-3)
    assert stats.ks_critical(50, alpha=0.01) == pytest.approx(sps.kstwo.ppf(0.99, 50))
    assert stats.ks_critical(50, alpha=0.01) > stats.ks_critical(50)


def test_ks_statistic_of_a_sample_at_the_quantiles_is_half_a_step():
    n = 200
    sample = sps.norm.ppf((np.arange(n) + 0.5) / n)
    assert stats.ks_statistic(sample, sps.norm.cdf) == pytest.approx(0.5 / n, abs=1e-12)
    assert stats.ks_statistic(sample, "norm") == pytest.approx(0.5 / n, abs=1e-12)


def test_ks_fits_are_scipys_with_maximum_likelihood_parameters():
    rng = np.random.default_rng(0)
    x = rng.laplace(0.0, 3e-6, size=3000)  # gradient-sized values
    out = stats.ks_fits(x)
    assert out["n"] == 3000 and out["critical"] == pytest.approx(sps.kstwo.ppf(0.95, 3000))
    # the fits are equivariant: fitting the standardised sample gives scipy's own statistic on x
    assert out["gaussian"] == pytest.approx(sps.kstest(x, "norm", args=sps.norm.fit(x)).statistic, abs=1e-9)
    assert out["laplace"] == pytest.approx(
        sps.kstest(x, "laplace", args=sps.laplace.fit(x)).statistic, abs=1e-9
    )
    z = (x - x.mean()) / x.std()
    assert out["student"] == pytest.approx(sps.kstest(z, "t", args=sps.t.fit(z)).statistic, abs=1e-6)


@pytest.mark.parametrize("draw", ["normal", "laplace"])
def test_ks_fits_accept_the_true_family_and_reject_the_other(draw):
    x = getattr(np.random.default_rng(1), draw)(size=5000)
    out = stats.ks_fits(x)
    right, wrong = ("gaussian", "laplace") if draw == "normal" else ("laplace", "gaussian")
    assert out[right] < out["critical"] < out[wrong]
    if draw == "normal":
        assert out["student"] < out["critical"]  # a Student-t with many degrees of freedom


def test_ks_fits_of_a_constant_sample_are_nan():
    out = stats.ks_fits(np.zeros(10))
    assert math.isnan(out["gaussian"]) and out["n"] == 10


def test_cosine_distance_on_hand_computed_tensors():
    g = torch.tensor([3.0, 4.0])
    assert stats.cosine_distance(g, torch.tensor([4.0, 3.0])) == pytest.approx(1 - 24 / 25)
    assert stats.cosine_distance(g, 2 * g) == pytest.approx(0.0, abs=1e-15)
    assert stats.cosine_distance(g, -g) == pytest.approx(2.0)
    assert stats.cosine_distance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == pytest.approx(1.0)
    assert stats.cosine_distance(g, torch.zeros(2)) == 1.0
    # a quantized gradient: q = round(127 g / max|g|) with nearest rounding
    g = torch.tensor([[0.5, -1.0], [0.01, 0.25]], dtype=torch.float64)
    g_hat = torch.tensor([[64.0, -127.0], [1.0, 32.0]], dtype=torch.float64) / 127
    dot = (0.5 * 64 + 1.0 * 127 + 0.01 * 1 + 0.25 * 32) / 127
    norms = math.sqrt(0.25 + 1 + 1e-4 + 0.0625) * math.sqrt(64**2 + 127**2 + 1 + 32**2) / 127
    assert stats.cosine_distance(g, g_hat) == pytest.approx(1 - dot / norms, rel=1e-12)


def test_daiq_error_on_hand_computed_tensors():
    g = torch.tensor([0.0, 1.0, -2.0])
    g_hat = torch.tensor([0.0, 1.5, -2.0])
    assert stats.daiq_error(g, g_hat) == pytest.approx(0.5 * math.exp(0.2) / 3)
    assert stats.daiq_error(g, g_hat, alpha=0.0) == pytest.approx(0.5 / 3)
    h = torch.tensor([0.0, 1.0, -1.0])  # |g - h| = 1 at |g| = 2
    assert stats.daiq_error(g, h) == pytest.approx(math.exp(0.4) / 3)
    assert stats.daiq_error(g, g) == 0.0


def test_inverted_t_fit_finds_the_piecewise_uniform_it_was_drawn_from():
    rng = np.random.default_rng(2)
    eps, top = 0.05, 1.0
    inner = rng.uniform(-eps, eps, 8000)  # 80% of the mass within eps: a = 0.8 / (2 eps)
    outer = rng.uniform(eps, top, 2000) * rng.choice([-1, 1], 2000)
    x = np.concatenate([inner, outer])
    e, a, b, t = stats.inverted_t_fit(x)
    assert e == pytest.approx(eps, rel=0.03) and t == pytest.approx(top, abs=1e-3)
    assert a == pytest.approx(0.8 / (2 * eps), rel=0.05) and b == pytest.approx(
        0.2 / (2 * (top - eps)), rel=0.05
    )
    cdf = stats.inverted_t_cdf(np.array([-2.0, -t, 0.0, t, 2.0]), e, a, b, t)
    np.testing.assert_allclose(cdf, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-9)
    dn = stats.dn_fits(x)
    assert dn["inverted_t"] < 0.02 < dn["gaussian"]  # the Inverted-T fits, a Gaussian does not
    gauss = stats.dn_fits(rng.normal(size=5000))
    assert gauss["gaussian"] < gauss["inverted_t"]


def test_fraction_above_sigma_and_summary():
    x = torch.from_numpy(np.random.default_rng(3).normal(size=200_000))
    assert stats.fraction_above_sigma(x) == pytest.approx(0.3173, abs=0.005)  # P(|z| > 1), DAIQ's 30%
    s = stats.summary(torch.tensor([0.0, 0.0, 3.0, -4.0]))
    assert s["n"] == 4 and s["absmax"] == 4.0 and s["nonzero"] == 0.5 and s["mean"] == pytest.approx(-0.25)


def test_histogram_and_slice_histograms():
    x = torch.tensor([-1.0, -0.2, 0.0, 0.3, 1.0, 5.0])  # 5 lands in the last bin
    assert stats.histogram(x, 4, 1.0) == [1, 1, 2, 2]
    g = torch.zeros(4, 3, 8)
    g[:, 0] = torch.linspace(-1, 1, 32).reshape(4, 8)  # spread: many values beyond sigma
    g[:, 1, 0] = 5.0  # one spike per sample: few values beyond sigma (Inverted-T-like)
    g[:, 2] = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    out = stats.slice_histograms(g, axis=1, count=2, bins=10)
    assert out["index"] == [1, 0]  # the lowest and the highest P(|g| > sigma)
    assert len(out["all_above_sigma"]) == 3 and all(sum(h) == 32 for h in out["hist"])


def test_subsample_uses_its_own_generator():
    state = torch.random.get_rng_state()
    idx = stats.subsample(1000, 100, torch.Generator().manual_seed(0))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert 90 <= idx.numel() <= 100 and idx.max() < 1000 and torch.equal(idx, idx.unique())
    assert stats.subsample(50, 100, torch.Generator()) is None
