"""Hand-worked checks of the paired interval, the minimum detectable effect, the gap rule and clipping
(rlcompare.report.stats)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlcompare.report import stats  # noqa: E402
from rlcompare.report.stats import Interval  # noqa: E402

# five seeds of two arms; seed s shares its random numbers across arms, so the arms move together
A = [0.50, 0.46, 0.48, 0.52, 0.44]
B = [0.47, 0.44, 0.47, 0.48, 0.44]
# d = A - B = [0.03, 0.02, 0.01, 0.04, 0.00]: mean 0.02, squared deviations 1e-4, 0, 1e-4, 4e-4, 4e-4 -> 1e-3,
# s_d^2 = 1e-3 / 4 = 2.5e-4, SE = sqrt(2.5e-4 / 5) = sqrt(5e-5) = 0.00707107
SE_PAIRED = math.sqrt(5e-5)
T975_4 = 2.776445  # t table, 4 df, 0.975
T80_4 = 0.940965  # t table, 4 df, 0.80


def test_paired_interval_by_hand():
    iv = stats.paired_difference_ci(A, B)
    half = T975_4 * SE_PAIRED  # 0.019632
    assert iv.point == pytest.approx(0.02)
    assert iv.low == pytest.approx(0.02 - half, abs=1e-6)  # 0.000368
    assert iv.high == pytest.approx(0.02 + half, abs=1e-6)  # 0.039632


def test_paired_p_value_by_hand():
    # t = 0.02 / 0.00707107 = 2.828427 with 4 df. For 4 df, F(t) = 1/2 + (3/4) u (1 - u^2 / 3), u = t / sqrt(4 + t^2)
    # u = 2.828427 / sqrt(12) = 0.816497, u^2 = 2/3: F = 0.5 + 0.75 * 0.816497 * 7/9 = 0.976290; p = 2 (1 - F)
    assert stats.paired_p_value(A, B) == pytest.approx(0.047421, abs=2e-6)


def test_paired_is_narrower_than_welch_when_the_arms_move_together():
    # Welch on the same numbers: var(A) = 40e-4 / 4 = 1e-3, var(B) = 14e-4 / 4 = 3.5e-4, SE = sqrt(1.35e-3 / 5)
    welch = stats.difference_ci(A, B)
    assert (welch.high - welch.point) / math.sqrt(1.35e-3 / 5) > 2.3  # a t quantile with Welch's ~6.6 df
    assert welch.low < 0 < stats.paired_difference_ci(A, B).low  # Welch holds 0, the pairing excludes it


def test_identical_arms_have_a_zero_width_paired_interval():
    # c4 of docs/claims.md: two arms that compute the same steps seed for seed; Welch still says +-0.041
    x = [0.45, 0.41, 0.47, 0.40, 0.46]
    assert stats.paired_difference_ci(x, x) == Interval(0.0, 0.0, 0.0)
    assert stats.paired_p_value(x, x) == 1.0
    assert stats.difference_ci(x, x).width > 0.05


def test_paired_needs_one_value_per_seed_on_each_side():
    with pytest.raises(ValueError, match="one value per seed"):
        stats.paired_difference_ci([1, 2, 3], [1, 2])
    assert math.isnan(stats.paired_difference_ci([1.0], [0.5]).low)
    assert math.isnan(stats.paired_p_value([1.0], [0.5]))


def test_paired_mde_by_hand():
    # (t_0.975,4 + t_0.80,4) x SE = (2.776445 + 0.940965) x 0.00707107 = 0.026286
    assert stats.paired_mde(A, B) == pytest.approx((T975_4 + T80_4) * SE_PAIRED, rel=1e-5)
    assert stats.paired_mde(A, B) == pytest.approx(0.026286, abs=1e-6)


def test_welch_mde_of_five_seeds_with_sd_002_is_about_4_points():
    # issue 42: sd 0.02, 5 seeds a side. z = [-2, -1, 0, 1, 2] has sd sqrt(2.5); scaled to sd 0.02.
    z = np.array([-2, -1, 0, 1, 2.0]) * 0.02 / math.sqrt(2.5)
    a, b = 0.45 + z, 0.40 + z[::-1]
    # SE = sqrt(2 x 0.02^2 / 5) = 0.0126491; Welch df = (2v)^2 / (2 v^2 / 4) = 8;
    # t_0.975,8 = 2.306004, t_0.80,8 = 0.888890 (tables): 3.194894 x 0.0126491 = 0.040413
    assert stats.welch_mde(a, b) == pytest.approx(0.040413, abs=2e-6)


def test_mde_has_the_power_it_claims():
    # a true difference equal to the MDE is found by the two-sided 5% test in about 80% of simulated seed sets
    # (Bloom's formula approximates the noncentral t; at 4 df it runs a little low)
    rng = np.random.default_rng(7)
    n, trials = 5, 20000
    se = 1.0 / math.sqrt(n)
    effect = float(stats.minimum_detectable_effect(se, n - 1))
    d = rng.normal(effect, 1.0, size=(trials, n))
    found = np.mean(np.asarray(stats.paired_p_values(d, np.zeros_like(d))) < 0.05)
    assert 0.74 < found < 0.84


def test_mde_rejects_a_bad_power():
    with pytest.raises(ValueError, match="power"):
        stats.minimum_detectable_effect(1.0, 4, power=1.2)


def test_gap_rule_by_hand():
    # sorted 0.28 | 0.44 0.45 0.45 0.46: the widest gap 0.16; inside the groups SS = 2e-4 over 3 df -> sd 0.00816,
    # floored at the grid step 0.01: ratio 16 >= 7.18 (5 seeds). One seed on its side: one outlier (seed 4), not
    # two modes (issue 65)
    collapsed = [0.45, 0.46, 0.44, 0.45, 0.28]
    assert stats.gap_ratios(collapsed) == pytest.approx(16.0)
    assert not stats.looks_bimodal(collapsed) and stats.lone_outlier(collapsed) == 4
    assert stats.lone_outlier([0.62, 0.45, 0.46, 0.44, 0.45]) == 0  # a high one too
    # two modes: 0.28 0.29 | 0.44 0.45 0.46: gap 0.15; SS 5e-5 + 2e-4 = 2.5e-4 over 3 df -> sd 0.00913, floored at
    # the grid step 0.01: ratio 15 >= 7.18, two seeds on the smaller side
    modes = [0.45, 0.46, 0.44, 0.28, 0.29]
    assert stats.gap_ratios(modes) == pytest.approx(15.0)
    assert stats.looks_bimodal(modes) and stats.lone_outlier(modes) is None
    # evenly spread: widest gap 0.01 (the first), groups 0.44 | 0.45..0.48: SS = 5e-4 / 3 df -> sd 0.01291
    even = [0.44, 0.45, 0.46, 0.47, 0.48]
    assert stats.gap_ratios(even) == pytest.approx(0.01 / math.sqrt(5e-4 / 3))
    assert not stats.looks_bimodal(even)
    # two levels one grid step apart are not two modes
    assert not stats.looks_bimodal([0.45, 0.45, 0.45, 0.45, 0.455])
    assert not stats.looks_bimodal([0.45, 0.46, 0.28])  # 3 seeds: the rule does not apply
    assert not stats.looks_bimodal([0.45, 0.46, 0.44, float("nan")])


def test_a_split_smaller_than_the_evals_own_sampling_error_is_not_two_modes():
    # c13's DAPO pass@1 (window), 200 prompts x 64 samples = 12,800 draws per eval (issue 65). Sorted 0.2300 0.2301 |
    # 0.2333 0.2337 0.2342: gap 0.0032; SS 5e-9 + 4.0667e-7 = 4.1167e-7 over 3 df -> sd 3.7044e-4 (grid step 1e-4
    # smaller): ratio 8.64 >= 7.18, two modes on the spread alone
    dapo = [0.2342, 0.2300, 0.2337, 0.2301, 0.2333]
    assert stats.gap_ratios(dapo) == pytest.approx(0.0032 / math.sqrt(4.116667e-7 / 3), rel=1e-4)
    assert stats.looks_bimodal(dapo)
    # the eval's sampling error at the mean 0.23226: sqrt(0.23226 x 0.76774 / 12800) = 0.0037324, above the gap
    noise = stats.eval_sampling_error(dapo, 12800)
    assert noise == pytest.approx(math.sqrt(0.23226 * 0.76774 / 12800), rel=1e-5)
    assert stats.gap_ratios(dapo, noise) == pytest.approx(0.0032 / noise) and not stats.looks_bimodal(dapo, noise)
    with pytest.raises(ValueError, match="draws"):
        stats.eval_sampling_error(dapo, 0)


@pytest.mark.parametrize("n", [4, 5, 8, 12])
def test_gap_rule_raises_5_percent_false_alarms_on_normal_seeds(n):
    rng = np.random.default_rng(100 + n)
    x = rng.normal(3.0, 0.7, size=(20000, n))  # any mean and sd: the ratio does not depend on them
    alarms = np.mean(np.asarray(stats.gap_ratios(x)) >= stats.GAP_CRITICAL[n])
    assert abs(alarms - 0.05) < 0.006  # 4 Monte Carlo standard errors of a share near 0.05 over 20,000 sets


def test_clip_interval_to_physical_bounds():
    # issue 41 item 10: an accuracy interval that reached 1.217
    assert stats.clip_interval(Interval(0.9, 0.583, 1.217), 0.0, 1.0) == (Interval(0.9, 0.583, 1.0), True)
    assert stats.clip_interval(Interval(30.0, -4.0, 64.0), 0.0) == (Interval(30.0, 0.0, 64.0), True)
    inside = Interval(0.5, 0.4, 0.6)
    assert stats.clip_interval(inside, 0.0, 1.0) == (inside, False)
    nan = Interval(0.5, float("nan"), float("nan"))
    assert stats.clip_interval(nan, 0.0, 1.0)[1] is False


def test_the_report_floors_the_gap_rule_at_a_sampled_evals_error():
    # issue 65: the report's bimodal column on c13's DAPO pass@1 values (above) with 200 prompts x 64 samples
    from types import SimpleNamespace

    from rlcompare.report.compare import _bimodal_arms, eval_draws

    runs = [SimpleNamespace(config={"eval": {"samples": 64}, "prompts": {"n_eval": 200}})]
    assert eval_draws(runs, "eval/pass@1") == 12800
    assert eval_draws(runs, "eval/accuracy") == 0 and eval_draws([SimpleNamespace(config={})], "eval/pass@1") == 0
    dapo = np.array([0.2342, 0.2300, 0.2337, 0.2301, 0.2333])
    flat = np.full(5, 0.2326)
    assert _bimodal_arms([("dapo", dapo), ("grpo", flat)]) == "dapo"
    assert _bimodal_arms([("dapo", dapo), ("grpo", flat)], 12800) == ""
