"""Statistics of activations, weights and gradients, as the papers measure them.

    ks_fits(sample)                 KS statistic of a sample against Gaussian, Laplace and Student-t
                                    fitted by maximum likelihood, and the critical value (UI8 Table 1)
    cosine_distance(g, g_hat)       d_c = 1 - cos(g, g_hat) (UI8 eq. 7)
    daiq_error(g, g_hat, alpha)     E = mean |g - g_hat| e^(alpha |g|) (DAIQ eq. 8, Figure 3a)
    inverted_t_fit / dn_fits        DAIQ's Inverted-T (eq. 13) and a Gaussian fitted to a sample, and the
                                    KS distance D_n of each to it (eq. 16, Figure 3b)
    summary / histogram / slice_histograms / subsample   what the recorder (repro.recorder) stores

Plain functions of tensors and arrays: they never touch torch's global random state (a subsample
draws from its own generator), so computing them during training changes nothing in the run.
"""

from __future__ import annotations

import math

import numpy as np
import torch

KS_ALPHA = 0.05
DAIQ_ALPHA = 0.2  # the alpha of f(g) = e^(alpha |g|) that DAIQ Figure 3a plots E with
LAMBDA = 0.3  # DAIQ's discriminator threshold on P(|g| > sigma) (eq. 15)


def _scipy_stats():
    """scipy.stats, imported on first use: a training run imports this module (repro.recorder) but fits
    nothing, and the import costs about a second of every run's and Slurm job's start."""
    from scipy import stats

    return stats


# ----------------------------------------------------------------------------------- KS statistics
def ks_critical(n: int, alpha: float = KS_ALPHA) -> float:
    """The largest D_n that accepts the hypothesis at significance `alpha` for n samples (two-sided, the
    exact distribution of D_n: scipy.stats.kstwo)."""
    return float(_scipy_stats().kstwo.ppf(1.0 - alpha, int(n)))


def ks_statistic(sample, cdf) -> float:
    """sup |F_n - F| of a sample against a CDF (a callable or a scipy distribution name)."""
    return float(_scipy_stats().kstest(np.asarray(sample, dtype=np.float64), cdf).statistic)


FITTED = {"gaussian": "norm", "laplace": "laplace", "student": "t"}  # scipy.stats' names


def ks_fits(sample, alpha: float = KS_ALPHA) -> dict[str, float]:
    """KS statistic of `sample` against each distribution of FITTED with its parameters fitted by
    maximum likelihood (scipy's fit), as UI8 Table 1, plus `critical` at `alpha` and `n`.

    The sample is standardised first (the KS statistic does not change under an affine map, and the
    optimiser of Student-t's fit fails on gradients of magnitude 1e-6). Note: critical values for
    fitted parameters are smaller than these (Lilliefors); UI8 compares with these, so do we.
    """
    x = np.asarray(sample, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    out: dict[str, float] = {"n": int(x.size), "critical": ks_critical(max(x.size, 1), alpha)}
    std = x.std() if x.size else 0.0
    if x.size < 2 or std == 0:
        return {**out, **{name: float("nan") for name in FITTED}}
    z = (x - x.mean()) / std
    for name, scipy_name in FITTED.items():
        dist = getattr(_scipy_stats(), scipy_name)
        out[name] = ks_statistic(z, dist(*dist.fit(z)).cdf)
    return out


# ------------------------------------------------------------------- DAIQ's Inverted-T and D_n
def inverted_t_fit(sample) -> tuple[float, float, float, float]:
    """(eps, a, b, top) of DAIQ's Inverted-T (eq. 13), a symmetric piecewise-uniform density: a on
    |g| < eps, b on eps <= |g| <= top = max|g|, fitted by maximum likelihood.

    For a given eps the likelihood is largest with a = n_in / (2 n eps), b = n_out / (2 n (top - eps));
    eps is the |g| of the sample (between its 1st and 99th percentiles, exact zeros excluded: a point mass
    at 0 would make the likelihood unbounded) that maximises n_in log a + n_out log b. DAIQ does not
    say how it fits eps; this is our reading.
    """
    m = np.sort(np.abs(np.asarray(sample, dtype=np.float64).ravel()))
    n = m.size
    top = float(m[-1]) if n else 0.0
    if n < 4 or top == 0:
        return top, 1.0 / (2 * top) if top else 0.0, 0.0, top
    lo, hi = max(int(0.01 * n), 1), min(int(0.99 * n), n - 1)
    idx = np.arange(lo, hi)
    eps = m[idx]
    ok = (eps > 0) & (eps < top)
    if not ok.any():
        return top, 1.0 / (2 * top), 0.0, top
    idx, eps = idx[ok], eps[ok]
    n_in = idx.astype(np.float64)  # values strictly below eps (m is sorted; ties count as outside)
    n_out = n - n_in
    loglik = n_in * np.log(n_in / (2 * n * eps)) + n_out * np.log(n_out / (2 * n * (top - eps)))
    best = int(np.argmax(loglik))
    e, k = float(eps[best]), float(n_in[best])
    return e, k / (2 * n * e), (n - k) / (2 * n * (top - e)), top


def inverted_t_cdf(x, eps: float, a: float, b: float, top: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    r = np.minimum(np.abs(x), top)
    mass = a * np.minimum(r, eps) + b * np.clip(r - eps, 0.0, None)
    return 0.5 + np.sign(x) * mass


def dn_fits(sample) -> dict[str, float]:
    """D_n (DAIQ eq. 16) of the sample against a Gaussian (mean and std by maximum likelihood) and
    against the fitted Inverted-T; also the fraction of |g| > sigma (DAIQ's discriminator, eq. 15)."""
    x = np.asarray(sample, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if x.size < 2 or x.std() == 0:
        return {"gaussian": float("nan"), "inverted_t": float("nan"), "eps": float("nan"), "n": int(x.size)}
    norm = _scipy_stats().norm
    mu, sigma = norm.fit(x)
    eps, a, b, top = inverted_t_fit(x)  # symmetric about 0, as DAIQ's assumption 1
    return {
        "gaussian": ks_statistic(x, norm(mu, sigma).cdf),
        "inverted_t": ks_statistic(x, lambda v: inverted_t_cdf(v, eps, a, b, top)),
        "eps": eps,
        "n": int(x.size),
    }


# ------------------------------------------------------------------------ distances and errors
def _flat64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1).to(torch.float64)


def cosine_distance(g: torch.Tensor, g_hat: torch.Tensor) -> float:
    """d_c = 1 - g . g_hat / (|g| |g_hat|) (UI8 eq. 7) in float64; 1 when either is all zero."""
    a, b = _flat64(g), _flat64(g_hat)
    denom = float(a.norm() * b.norm())
    return 1.0 if denom == 0 else 1.0 - float(a @ b) / denom


def daiq_error(g: torch.Tensor, g_hat: torch.Tensor, alpha: float = DAIQ_ALPHA) -> float:
    """DAIQ's quantization error E = integral |g - g_hat| f(g) p(g) dg with f(g) = e^(alpha |g|)
    (eq. 8), over the empirical distribution of g: mean |g - g_hat| e^(alpha |g|)."""
    a, b = _flat64(g), _flat64(g_hat)
    if a.numel() == 0:
        return 0.0
    return float(((a - b).abs() * torch.exp(alpha * a.abs())).mean())


def fraction_above_sigma(x: torch.Tensor) -> float:
    """P(|x| > sigma), sigma the standard deviation of x: DAIQ's discriminator (eq. 15)."""
    x = _flat64(x)
    if x.numel() < 2:
        return 0.0
    return float((x.abs() > x.std(correction=0)).double().mean())


# ------------------------------------------------------------------------------- histograms
def histogram(x: torch.Tensor, bins: int, limit: float) -> list[int]:
    """Counts of x in `bins` equal bins over [-limit, limit] (values outside go to the end bins)."""
    x = x.detach().reshape(-1).float()
    if limit <= 0 or not math.isfinite(limit):
        limit = 1.0
    return torch.histc(x.clamp(-limit, limit), bins=bins, min=-limit, max=limit).long().tolist()


def slice_histograms(x: torch.Tensor, axis: int, count: int, bins: int) -> dict:
    """Histograms of `count` slices of x along `axis` (channels: axis 1; samples: axis 0), each over its
    own [-max, max] and normalised to g / max|g|, chosen at evenly spaced ranks of P(|g| > sigma) so that
    both ends of DAIQ's discriminator are shown; plus P(|g| > sigma) of every slice."""
    x = x.detach().float()
    if x.dim() < 2:
        x = x.reshape(1, -1)
    rows = x.movedim(axis, 0).reshape(x.shape[axis], -1)
    sigma = rows.std(dim=1, correction=0, keepdim=True)
    above = (rows.abs() > sigma).float().mean(dim=1)
    order = torch.argsort(above)
    ranks = torch.linspace(0, len(order) - 1, min(count, len(order))).round().long()
    picks = order[ranks].unique_consecutive()
    hists = []
    for i in picks.tolist():
        top = float(rows[i].abs().max())
        hists.append(histogram(rows[i] / (top if top > 0 else 1.0), bins, 1.0))
    return {"index": picks.tolist(), "above_sigma": [float(above[i]) for i in picks.tolist()],
            "all_above_sigma": above.tolist(), "hist": hists}  # fmt: skip


# ------------------------------------------------------------------------------------ samples
def subsample(numel: int, size: int, generator: torch.Generator, device=None) -> torch.Tensor | None:
    """Indices of a uniform random subsample of at most `size` of `numel` elements (drawn with their own
    generator, duplicates dropped), or None when every element fits."""
    if numel <= size:
        return None
    idx = torch.randint(numel, (size,), generator=generator)
    return torch.unique(idx).to(device) if device is not None else torch.unique(idx)


def summary(x: torch.Tensor) -> dict[str, float]:
    """n, mean, std, max|x|, the nonzero ratio and P(|x| > sigma) of one tensor."""
    f = _flat64(x)
    n = f.numel()
    if n == 0:
        return {"n": 0, "mean": 0.0, "std": 0.0, "absmax": 0.0, "nonzero": 0.0, "above_sigma": 0.0}
    std = float(f.std(correction=0))
    return {
        "n": n,
        "mean": float(f.mean()),
        "std": std,
        "absmax": float(f.abs().max()),
        "nonzero": float((f != 0).sum()) / n,
        "above_sigma": float((f.abs() > std).double().mean()) if std > 0 else 0.0,
    }
