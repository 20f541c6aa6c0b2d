"""The 95% interval of a row's INT8 - FP32: seeds' spread with Student's t, the test set's paired error."""

from __future__ import annotations

import math
import random

import pytest

from tables.delta_interval import delta_interval, paired_test_se, seeds_to_settle
from tasks.top1 import pack_flags, unpack_flags


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 8, 10_000])
def test_flags_round_trip_through_their_packed_text(n):
    flags = [random.Random(n).randint(0, 1) for _ in range(n)]
    if flags:
        flags[0] = 0  # a leading zero must survive
    assert unpack_flags(pack_flags(flags)) == (flags if flags else None)
    assert unpack_flags(None) is None and unpack_flags("") is None


def test_images_both_runs_agree_on_add_no_test_error():
    same = [1, 0, 1, 1] * 50
    assert paired_test_se([(same, same)]) == 0.0
    one_flip = list(same)
    one_flip[1] = 1  # INT8 right where FP32 was wrong, once in 200 images
    u_var = (1 / 200) * (1 - 1 / 200) * 200 / 199  # sample variance of one 1 among 199 zeros
    assert paired_test_se([(one_flip, same)]) == pytest.approx(100 * math.sqrt(u_var / 200))


def test_missing_or_mismatched_flags_give_no_test_error():
    a = [1, 0] * 10
    assert paired_test_se([(a, None)]) is None
    assert paired_test_se([(a, a[:-1])]) is None
    assert paired_test_se([]) is None


def test_interval_combines_seed_spread_and_test_error():
    diffs = [0.2, -0.1, 0.5]
    seed_half = 4.302653 * 0.3 / math.sqrt(3)  # t(0.975, 2) * stdev / sqrt(n)
    assert delta_interval(diffs, []).half_width == pytest.approx(seed_half, rel=1e-5)
    rng = random.Random(0)
    pairs = [
        ([rng.randint(0, 1) for _ in range(400)], [rng.randint(0, 1) for _ in range(400)]) for _ in diffs
    ]
    out = delta_interval(diffs, pairs)
    assert out.test_se is not None and out.test_se > 0
    assert out.half_width == pytest.approx(math.hypot(seed_half, 1.959964 * out.test_se), rel=1e-5)
    assert delta_interval([0.3], pairs[:1]).half_width is None  # one seed: no training share, no interval


def test_seeds_to_settle_is_the_first_count_whose_interval_clears_the_edge():
    # spread 0.5, no test error: t(n-1) * 0.5 / sqrt(n) < 0.5 first at n = 7 (2.447 / 2.646)
    assert seeds_to_settle(0.5, None, 3, 0.5) == 7
    assert seeds_to_settle(0.5, None, 3, 1.0) < 7 < seeds_to_settle(0.5, None, 3, 0.3)
    # the test error shrinks with the seeds: 1.96 * 0.3 * sqrt(3 / n) alone passes 0.3 only past n = 11
    assert seeds_to_settle(1e-9, 0.3, 3, 0.3) == 12
    assert seeds_to_settle(0.5, None, 3, 0.0) is None  # a difference on the edge is never settled
    assert seeds_to_settle(5.0, None, 3, 0.1, most=100) is None
    assert seeds_to_settle(None, 0.1, 3, 1.0) is None  # one seed: no spread to project from
