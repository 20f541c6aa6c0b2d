"""A 95% confidence interval for a row's INT8 - FP32 accuracy: the seeds' spread and the test set's error.

Two sources of noise make the measured difference D (mean over seeds of INT8 - FP32, in points) differ
from the one a larger experiment would find:
- training: another seed trains another network. Its share is the spread of the per-seed differences,
  s_d / sqrt(n), with Student's t at n - 1 degrees of freedom (few seeds: wide);
- the test set: another 10,000 images would score differently. FP32 and INT8 are scored on the same
  images, so the error is paired: per image x, u(x) = mean over seeds of (INT8 right - FP32 right), and
  the standard error is sqrt(var(u) / N) (the images where both are right or both wrong add nothing).
  It needs each run's per-image flags (tasks.top1.Top1Accuracy); cells cached without them count the
  training share alone, and the table says so.
The two are independent, so the half-width is sqrt((t s_d / sqrt(n))^2 + (1.96 se_test)^2). With one
seed there is no estimate of the training share: no interval.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats

LEVEL = 0.95


@dataclass(frozen=True)
class DeltaInterval:
    half_width: float | None  # points; None with fewer than two seeds
    test_se: float | None  # points: the test set's paired standard error of D; None without flags
    seeds: int


def binomial_se(accuracy: float | None, n_images: int) -> float | None:
    """The test set's standard error (points) of an accuracy (%) measured on n_images images; None
    without images. The seeds share the test set, so their mean has this error too, not a smaller one."""
    if accuracy is None or n_images < 1:
        return None
    p = min(max(accuracy / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1.0 - p) / n_images)


def paired_test_se(pairs: list[tuple[list[int], list[int]]]) -> float | None:
    """The test set's standard error (points) of the mean over seeds of INT8 - FP32 accuracy, from each
    seed's (INT8 flags, FP32 flags) on the same images; None if any is missing or the lengths differ."""
    if not pairs or any(i is None or f is None for i, f in pairs):
        return None
    n_images = len(pairs[0][0])
    if n_images < 2 or any(len(i) != n_images or len(f) != n_images for i, f in pairs):
        return None
    u = [sum(i[x] - f[x] for i, f in pairs) / len(pairs) for x in range(n_images)]
    return 100.0 * math.sqrt(statistics.variance(u) / n_images)


def delta_interval(diffs: list[float], pairs: list[tuple[list[int], list[int]]]) -> DeltaInterval:
    """`diffs`: the per-seed INT8 - FP32 differences (points); `pairs`: their per-image flags."""
    test_se = paired_test_se(pairs) if len(pairs) == len(diffs) else None
    if len(diffs) < 2:
        return DeltaInterval(None, test_se, len(diffs))
    t = stats.t.ppf(0.5 + LEVEL / 2, len(diffs) - 1)
    seed_half = t * statistics.stdev(diffs) / math.sqrt(len(diffs))
    test_half = 0.0 if test_se is None else stats.norm.ppf(0.5 + LEVEL / 2) * test_se
    return DeltaInterval(math.hypot(seed_half, test_half), test_se, len(diffs))


def seeds_to_settle(
    spread: float | None, test_se: float | None, seeds: int, distance: float, most: int = 100
) -> int | None:
    """The fewest seeds whose 95% half-width is below `distance` (how far the measured difference lies
    from the edge it must clear), projected from `seeds` seeds' spread of the per-seed differences and
    paired test-set error, taken as the truth. The test-set error is scaled by sqrt(seeds / n): in the
    kept runs it falls so with the seeds (their per-image disagreements are nearly independent;
    docs/data.md). None without a spread, or when more than `most` seeds would be needed."""
    if spread is None or math.isnan(spread) or seeds < 1:
        return None
    z = stats.norm.ppf(0.5 + LEVEL / 2)
    for n in range(2, most + 1):
        test_half = 0.0 if test_se is None else z * test_se * math.sqrt(seeds / n)
        if math.hypot(stats.t.ppf(0.5 + LEVEL / 2, n - 1) * spread / math.sqrt(n), test_half) < distance:
            return n
    return None
