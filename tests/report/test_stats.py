"""Hand-worked checks of rlcompare.report.stats (rliable definitions, pure numpy)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlcompare.report import stats  # noqa: E402
from rlcompare.report.stats import (  # noqa: E402
    Interval,
    difference_ci,
    iqm,
    iqm_ci,
    mean_ci,
    probability_of_improvement,
    stratified_bootstrap_ci,
)


def _trim_mean_reference(x, prop=0.25):
    """scipy.stats.trim_mean written out: cut int(prop * n) sorted values from each end."""
    x = np.sort(np.asarray(x, float).ravel())
    k = int(prop * x.size)
    return x[k : x.size - k].mean()


# ---------------------------------------------------------------- IQM


def test_iqm_of_1_to_8_trims_two_each_side():
    # sorted 1..8, int(0.25*8)=2 cut each side -> mean(3,4,5,6) = 4.5
    assert iqm(np.arange(1, 9)) == pytest.approx(4.5)
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)  # order does not matter


@pytest.mark.parametrize(
    "x, expected",
    [
        ([1, 2, 3, 4, 100], 3.0),  # n=5: int(1.25)=1 cut -> mean(2,3,4)
        ([1, 2, 3, 4, 5, 100], 3.5),  # n=6: int(1.5)=1 -> mean(2,3,4,5)
        ([0, 1, 2, 3, 4, 5, 1000], 3.0),  # n=7: int(1.75)=1 -> mean(1..5)
        ([0, 10, 20, 30, 40, 50, 60, 70, 1000], 40.0),  # n=9: int(2.25)=2 -> mean(20..60)
        ([1, 2, 30], 11.0),  # n=3: int(0.75)=0, nothing cut -> plain mean
        ([5.0], 5.0),
    ],
)
def test_iqm_uses_trim_mean_rounding_down(x, expected):
    assert iqm(x) == pytest.approx(expected)


def test_iqm_matches_trim_mean_definition_on_random_sizes():
    rng = np.random.default_rng(1)
    for n in range(1, 30):
        x = rng.normal(size=n)
        assert iqm(x) == pytest.approx(_trim_mean_reference(x))


def test_iqm_pools_matrix_and_supports_axis():
    m = np.arange(1, 9, dtype=float).reshape(4, 2)  # runs x tasks, pooled like rliable
    assert iqm(m) == pytest.approx(4.5)
    rows = np.array([np.arange(1, 9), np.arange(1, 9) * 10.0])
    assert np.allclose(iqm(rows, axis=1), [4.5, 45.0])


def test_iqm_empty_raises():
    with pytest.raises(ValueError):
        iqm([])


# ---------------------------------------------------------------- probability of improvement


def test_poi_dominating_is_one_and_identical_is_half():
    assert probability_of_improvement([1, 2, 3], [0, 0, 0]) == 1.0
    assert probability_of_improvement([0, 0, 0], [1, 2, 3]) == 0.0
    assert probability_of_improvement([1, 2, 3], [1, 2, 3]) == pytest.approx(0.5)
    assert probability_of_improvement([0.3, 0.3], [0.3, 0.3, 0.3]) == pytest.approx(0.5)


def test_poi_with_ties_by_hand():
    # a=[1,2,2], b=[2,3]: pairs (1,2)=0 (1,3)=0 (2,2)=.5 (2,3)=0 (2,2)=.5 (2,3)=0 -> 1/6
    assert probability_of_improvement([1, 2, 2], [2, 3]) == pytest.approx(1 / 6)
    # and the complement: P(b > a) + .5 P(tie) = 1 - 1/6
    assert probability_of_improvement([2, 3], [1, 2, 2]) == pytest.approx(5 / 6)
    # a=[1,2,3], b=[2,2]: (1,2)=0 x2, (2,2)=.5 x2, (3,2)=1 x2 -> 3/6
    assert probability_of_improvement([1, 2, 3], [2, 2]) == pytest.approx(0.5)


def test_poi_averages_over_tasks():
    a = np.array([[1.0, 0.0], [2.0, 0.0]])  # task 0: a wins always; task 1: a loses always
    b = np.array([[0.0, 1.0], [0.0, 1.0]])
    assert probability_of_improvement(a, b) == pytest.approx(0.5)


def test_poi_bootstrap_interval():
    ci = probability_of_improvement([1, 2, 3], [0, 0, 0], ci=True, method="bootstrap")
    assert isinstance(ci, Interval)
    assert (ci.point, ci.low, ci.high) == (1.0, 1.0, 1.0)
    ci = probability_of_improvement([0.2, 0.3, 0.4, 0.5], [0.1, 0.3, 0.35, 0.4], ci=True, seed=3, method="bootstrap")
    assert 0.0 <= ci.low <= ci.point <= ci.high <= 1.0
    assert ci.width > 0
    assert ci == probability_of_improvement(
        [0.2, 0.3, 0.4, 0.5], [0.1, 0.3, 0.35, 0.4], ci=True, seed=3, method="bootstrap"
    )
    # several tasks: rliable's stratified bootstrap is the default
    two_tasks = probability_of_improvement(np.ones((3, 2)), np.zeros((3, 2)), ci=True)
    assert tuple(two_tasks) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="one task"):
        probability_of_improvement(np.ones((3, 2)), np.zeros((3, 2)), ci=True, method="newcombe")
    with pytest.raises(ValueError, match="method='nope'"):
        probability_of_improvement([1.0], [0.0], ci=True, method="nope")


def test_poi_bootstrap_matches_explicit_resampling():
    # the count-weighted shortcut must equal recomputing PoI on resampled arrays
    a = np.array([0.1, 0.5, 0.5, 0.9])
    b = np.array([0.2, 0.5, 0.7])
    reps = 50
    ci = probability_of_improvement(a, b, ci=True, reps=reps, seed=7, method="bootstrap")
    rng = np.random.default_rng(7)
    ia = rng.integers(0, a.size, size=(reps, a.size))
    ib = rng.integers(0, b.size, size=(reps, b.size))
    boots = [probability_of_improvement(a[ia[r]], b[ib[r]]) for r in range(reps)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    assert ci.low == pytest.approx(lo) and ci.high == pytest.approx(hi)


# ---------------------------------------------------------------- bootstrap intervals


def test_mean_ci_is_the_student_t_interval_by_hand():
    # [1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.302653 -> half width 4.302653 / sqrt(3) = 2.484138
    ci = mean_ci([1.0, 2.0, 3.0])
    assert ci.point == pytest.approx(2.0)
    assert ci.low == pytest.approx(2.0 - 2.484138, abs=1e-6) and ci.high == pytest.approx(2.0 + 2.484138, abs=1e-6)
    # [0.2, 0.3, 0.4]: s = 0.1, half width 0.2484138 (a bootstrap gave [0.2, 0.4], 2.5x too narrow)
    ci = mean_ci([0.2, 0.3, 0.4])
    assert ci.low == pytest.approx(0.0515862, abs=1e-6) and ci.high == pytest.approx(0.5484138, abs=1e-6)
    # 90%: t_{0.95, 2} = 2.919986
    ci = mean_ci([1.0, 2.0, 3.0], alpha=0.10)
    assert ci.high - 2.0 == pytest.approx(2.919986 / np.sqrt(3), abs=1e-6)


def test_mean_ci_ignores_reps_and_seed():
    y = np.random.default_rng(0).normal(size=12)
    assert mean_ci(y, seed=1) == mean_ci(y, seed=2) == mean_ci(y, reps=10) == mean_ci(y)


def test_ci_width_shrinks_with_n():
    rng = np.random.default_rng(0)
    small = mean_ci(rng.normal(size=5)).width
    big = mean_ci(rng.normal(size=500)).width
    assert big < small / 3


def test_all_equal_gives_zero_width():
    ci = mean_ci([0.7] * 5)
    assert ci.point == pytest.approx(0.7)
    assert ci.width == 0.0
    ci = stratified_bootstrap_ci({"a": [1.0, 1.0], "b": [1.0, 1.0, 1.0]}, "iqm")
    assert ci.width == 0.0


def test_single_value_has_no_interval():
    ci = mean_ci([0.4])
    assert ci.point == 0.4 and np.isnan(ci.low) and np.isnan(ci.high)
    assert all(np.isnan(v) for v in mean_ci([]))


def test_stratified_resampling_keeps_strata_apart():
    # strata {0,0,0} and {1,1,1}: each resampled within itself, so the pooled mean is always 0.5
    strat = stratified_bootstrap_ci([[0, 0, 0], [1, 1, 1]], "mean")
    assert strat.point == pytest.approx(0.5) and strat.width == 0.0
    # pooling them into one stratum gives a real spread
    pooled = stratified_bootstrap_ci(np.array([0, 0, 0, 1, 1, 1.0]), "mean")
    assert pooled.point == pytest.approx(0.5) and pooled.width > 0.3


def test_matrix_layout_matches_callable_and_named_statistic():
    m = np.array([[1, 2], [3, 4], [5, 6.0]])  # 3 runs x 2 tasks
    named = stratified_bootstrap_ci(m, "mean", reps=300, seed=5)
    func = stratified_bootstrap_ci(m, lambda s: float(np.mean(s)), reps=300, seed=5)
    assert named.point == pytest.approx(3.5)
    assert named.low == pytest.approx(func.low) and named.high == pytest.approx(func.high)
    # np.mean / stats.iqm are recognised as vectorisable too
    assert stratified_bootstrap_ci(m, np.mean, reps=300, seed=5) == named
    assert stratified_bootstrap_ci(m, stats.iqm, reps=300, seed=5) == stratified_bootstrap_ci(
        m, "iqm", reps=300, seed=5
    )


def test_percentile_interval_by_hand():
    # two values, one replicate per seed draw: compare against an explicit resample
    x = np.array([0.0, 1.0, 3.0])
    reps = 40
    ci = stratified_bootstrap_ci(x, "mean", reps=reps, seed=11)
    rng = np.random.default_rng(11)
    boots = x[rng.integers(0, 3, size=(reps, 3))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    assert ci.low == pytest.approx(lo) and ci.high == pytest.approx(hi)


def test_bootstrap_coverage_sanity():
    # ~95% of intervals should contain the true mean (0); allow slack for percentile bootstrap at n=20
    rng = np.random.default_rng(123)
    hits = 0
    trials = 200
    for i in range(trials):
        ci = mean_ci(rng.normal(size=20), reps=400, seed=i)
        hits += ci.low <= 0.0 <= ci.high
    assert 0.85 <= hits / trials <= 0.99


def test_iqm_ci():
    x = np.arange(1, 9, dtype=float)
    ci = iqm_ci(x)
    assert ci.point == pytest.approx(4.5)
    assert ci.low <= 4.5 <= ci.high


def test_iqm_ci_is_tukey_mclaughlin_by_hand():
    # n = 5: g = 1 cut each side, h = 3 kept: IQM = mean(2, 3, 4) = 3; winsorized [2, 2, 3, 4, 4]: s_w^2 = 4/4 = 1;
    # variance = (n - 1) s_w^2 / (h (h - 1)) = 4/6; df = h - 1 = 2: half = 4.302653 sqrt(2/3) = 3.513101
    ci = iqm_ci([5, 1, 4, 2, 3])
    assert ci.point == pytest.approx(3.0)
    assert ci.low == pytest.approx(3.0 - 3.513101, abs=1e-6) and ci.high == pytest.approx(3.0 + 3.513101, abs=1e-6)
    # an outlier moves the IQM's interval far less than the mean's
    assert iqm_ci([1, 2, 3, 4, 50]).width < mean_ci([1, 2, 3, 4, 50]).width / 5
    # below 4 values nothing is trimmed: the t interval
    assert iqm_ci([1.0, 2.0, 3.0]) == pytest.approx(mean_ci([1.0, 2.0, 3.0]))
    assert all(np.isnan(iqm_ci([1.0])[1:]))


def test_iqm_ci_when_the_kept_values_tie():
    # [1, 2, 2, 9]: kept [2, 2], winsorized [2, 2, 2, 2] has no spread though the seeds differ:
    # s^2 / n stands in: s^2 = (6.25 + 2.25 + 2.25 + 30.25) / 3 = 41/3; df = h - 1 = 1, t = 12.706205
    ci = iqm_ci([1, 2, 2, 9])
    assert ci.point == pytest.approx(2.0)
    assert ci.high - 2.0 == pytest.approx(12.706205 * np.sqrt(41 / 12), abs=1e-5)
    assert iqm_ci([0.5] * 6).width == 0.0  # all equal: zero width, as the mean's


def test_bad_arguments():
    with pytest.raises(ValueError):
        stratified_bootstrap_ci([[], [1.0]], "mean")
    with pytest.raises(ValueError):
        stratified_bootstrap_ci([1.0, 2.0], "nope")
    with pytest.raises(ValueError):
        stratified_bootstrap_ci([1.0, 2.0], "mean", alpha=1.5)
    with pytest.raises(ValueError):
        probability_of_improvement(np.ones((2, 2)), np.ones((2, 3)))


# ---------------------------------------------------------------- differences


def test_difference_constant_shift_is_degenerate():
    # every reference seed 0.3, every variant seed 0.4: difference exactly 0.1, zero width
    d = difference_ci([0.4, 0.4, 0.4], [0.3, 0.3, 0.3])
    assert d.point == pytest.approx(0.1)
    assert d.low == pytest.approx(0.1) and d.high == pytest.approx(0.1)


def test_difference_is_the_welch_interval_by_hand():
    a, b = [0.5, 0.6, 0.7], [0.2, 0.3, 0.4]
    d = difference_ci(a, b)
    assert d.point == pytest.approx(0.3)
    # s^2 = 0.01 on each side: se = sqrt(0.01/3 + 0.01/3) = 0.0816497; df = (2v)^2 / (2 v^2 / 2) = 4;
    # t_{0.975, 4} = 2.776445 -> half width 0.226696
    assert d.low == pytest.approx(0.3 - 0.226696, abs=1e-6) and d.high == pytest.approx(0.3 + 0.226696, abs=1e-6)
    r = difference_ci(b, a)
    assert r.point == pytest.approx(-0.3)
    assert r.low == pytest.approx(-d.high) and r.high == pytest.approx(-d.low)


def test_welch_satterthwaite_df_by_hand():
    # a = [1, 2, 3, 4]: s^2 = 5/3, va = 5/12; b = [2, 4, 9]: mean 5, s^2 = (9 + 1 + 16)/2 = 13, vb = 13/3
    # df = (5/12 + 13/3)^2 / ((5/12)^2 / 3 + (13/3)^2 / 2) = (3249/144) / (4081/432) = 9747/4081 = 2.388385
    e = stats._difference_estimate(
        stats._mean_estimate(np.array([1.0, 2, 3, 4])), stats._mean_estimate(np.array([2.0, 4, 9]))
    )
    assert float(e.df) == pytest.approx(9747 / 4081, rel=1e-12)
    assert float(e.variance) == pytest.approx(57 / 12)
    d = difference_ci([1, 2, 3, 4], [2, 4, 9])
    # t_{0.975, 2.388385} = 3.697055 (scipy.stats.t.ppf); se = sqrt(57/12) = 2.179449
    assert d.point == pytest.approx(-2.5)
    assert d.high == pytest.approx(-2.5 + 3.697055 * np.sqrt(57 / 12), abs=1e-5)
    # equal spreads and sizes: df = 2 (n - 1) = 4, as for Student's pooled test
    e = stats._difference_estimate(
        stats._mean_estimate(np.array([0.0, 1, 2])), stats._mean_estimate(np.array([5.0, 6, 7]))
    )
    assert float(e.df) == pytest.approx(4.0)


def test_welch_p_value_by_hand_and_matches_the_interval():
    # the pair above: t = 0.1 / 0.0816497 = 1.224745, df = 4; t with 4 df has the closed-form CDF
    # F(t) = 1/2 + t (6 + t^2) / (2 (4 + t^2)^(3/2))
    t = 0.1 / np.sqrt(0.02 / 3)
    by_hand = 2 * (1 - (0.5 + t * (6 + t * t) / (2 * (4 + t * t) ** 1.5)))
    assert stats.welch_p_value([0.3, 0.4, 0.5], [0.2, 0.3, 0.4]) == pytest.approx(by_hand, rel=1e-9)
    assert by_hand == pytest.approx(0.287864, abs=1e-6)
    rng = np.random.default_rng(4)
    for _ in range(30):
        a, b = rng.normal(0.8, 1.0, size=5), rng.normal(0.0, 1.0, size=5)
        d, p = difference_ci(a, b), stats.welch_p_value(a, b)
        assert (p < 0.05) == (d.low > 0 or d.high < 0)
    assert np.isnan(stats.welch_p_value([1.0], [1.0, 2.0]))


def test_difference_without_spread():
    # both sides constant: zero width; p = 0 for a real difference, 1 for none
    assert stats.welch_p_value([0.4, 0.4, 0.4], [0.3, 0.3, 0.3]) == 0.0
    assert stats.welch_p_value([0.4, 0.4, 0.4], [0.4, 0.4, 0.4]) == 1.0
    d = difference_ci([0.4, 0.4, 0.4], [0.4, 0.4, 0.4])
    assert (d.point, d.low, d.high) == (0.0, 0.0, 0.0)
    # one side constant: Welch's df is the other side's n - 1 = 2
    d = difference_ci([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert d.high - d.point == pytest.approx(2.484138, abs=1e-6)


def test_difference_keeps_its_keywords():
    a, b = [0.5, 0.6, 0.7, 0.9], [0.2, 0.3, 0.4, 0.4]
    assert difference_ci(a, b, reps=5, seed=9) == difference_ci(a, b)  # Welch: reps and seed unused
    med = difference_ci(a, b, statistic="median", reps=300, seed=2)  # other statistics: bootstrap
    assert med.point == pytest.approx(0.65 - 0.35)
    assert med == difference_ci(a, b, statistic="median", reps=300, seed=2)
    assert med != difference_ci(a, b, statistic="median", reps=300, seed=3)


def test_iqm_difference_is_yuens_by_hand():
    # a = 1..5: IQM 3, Tukey-McLaughlin variance 2/3 (see the IQM test), df 2; b = 2 a: IQM 6, variance 8/3
    # difference -3, variance 10/3, df = (10/3)^2 / ((2/3)^2/2 + (8/3)^2/2) = 100/34; t_{0.975, 100/34} = 3.218759
    d = difference_ci([1, 2, 3, 4, 5], [2, 4, 6, 8, 10], statistic="iqm")
    assert d.point == pytest.approx(-3.0)
    assert d.high == pytest.approx(-3.0 + 3.218759 * np.sqrt(10 / 3), abs=1e-5)


def test_difference_with_one_seed_has_no_interval():
    d = difference_ci([0.5], [0.2, 0.3])
    assert d.point == pytest.approx(0.25)
    assert np.isnan(d.low) and np.isnan(d.high)


def test_stats_module_is_numpy_only():
    import ast

    tree = ast.parse(Path(stats.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "typing", "math", "numpy"}  # math: the standard library's, no I/O


# ---------------------------------------------------------------- t and normal distributions


@pytest.mark.parametrize(
    "p, row",
    [
        # printed t tables, df = 1, 2, 3, 4, 5, 9, 10, 30
        (0.975, [12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.262157, 2.228139, 2.042272]),
        (0.95, [6.313752, 2.919986, 2.353363, 2.131847, 2.015048, 1.833113, 1.812461, 1.697261]),
        (0.995, [63.656741, 9.924843, 5.840909, 4.604095, 4.032143, 3.249836, 3.169273, 2.749996]),
    ],
)
def test_t_quantile_table(p, row):
    got = stats.t_quantile(p, np.array([1, 2, 3, 4, 5, 9, 10, 30.0]))
    assert np.allclose(got, row, rtol=0, atol=1.5e-6)
    assert np.allclose(stats.t_quantile(1 - p, np.array([1, 2, 3, 4, 5, 9, 10, 30.0])), -np.array(row), atol=1.5e-6)
    assert isinstance(stats.t_quantile(p, 3), float)


@pytest.mark.parametrize("p", [0.5, 0.51, 0.6, 0.75, 0.9, 0.975, 0.999, 1e-6, 0.3])
def test_t_quantile_closed_forms(p):
    # df = 1 (Cauchy): tan(pi (p - 1/2)); df = 2: (2p - 1) / sqrt(2 p (1 - p));
    # df = 4: 2 sign(p - 1/2) sqrt(cos(arccos(sqrt(a)) / 3) / sqrt(a) - 1), a = 4 p (1 - p)
    assert stats.t_quantile(p, 1) == pytest.approx(np.tan(np.pi * (p - 0.5)), rel=1e-10, abs=1e-12)
    assert stats.t_quantile(p, 2) == pytest.approx((2 * p - 1) / np.sqrt(2 * p * (1 - p)), rel=1e-10, abs=1e-12)
    a = 4 * p * (1 - p)
    df4 = np.sign(p - 0.5) * 2 * np.sqrt(np.cos(np.arccos(np.sqrt(a)) / 3) / np.sqrt(a) - 1)
    assert stats.t_quantile(p, 4) == pytest.approx(df4, rel=1e-9, abs=1e-12)


def test_t_p_value_against_the_density_integrated():
    # non-integer df (Welch's): P(|T| >= t) = 1 - 2 * integral_0^t of the density, by Simpson's rule
    for df, t in ((2.5, 1.7), (1.3, 0.4), (7.77, 3.1), (45.0, 2.0)):
        c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
        x = np.linspace(0.0, t, 20001)
        f = c * (1 + x * x / df) ** (-(df + 1) / 2)
        h = x[1] - x[0]
        integral = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
        assert stats.t_two_sided_p(t, df) == pytest.approx(1 - 2 * integral, rel=1e-9)
        # and the quantile inverts it
        assert stats.t_quantile(1 - stats.t_two_sided_p(t, df) / 2, df) == pytest.approx(t, rel=1e-9)
    # df = 1: P(|T| >= t) = 1 - 2 arctan(t) / pi
    assert stats.t_two_sided_p(3.0, 1) == pytest.approx(1 - 2 * math.atan(3.0) / math.pi, rel=1e-12)
    assert stats.t_two_sided_p(0.0, 3) == 1.0 and stats.t_two_sided_p(np.inf, 3) == 0.0


def test_normal_quantile_table():
    assert stats.normal_quantile(0.975) == pytest.approx(1.959963985, abs=1e-8)
    assert stats.normal_quantile(0.995) == pytest.approx(2.575829304, abs=1e-8)
    assert stats.normal_quantile(0.9) == pytest.approx(1.281551566, abs=1e-8)
    assert stats.normal_quantile(0.001) == pytest.approx(-3.090232306, abs=1e-8)
    assert stats.normal_quantile(0.5) == 0.0


def test_distribution_arguments_are_checked():
    with pytest.raises(ValueError, match="degrees of freedom"):
        stats.t_quantile(0.975, 0.5)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        stats.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="alpha=1.5"):
        mean_ci([1.0, 2.0], alpha=1.5)


# ---------------------------------------------------------------- probability of improvement: Newcombe


def _newcombe_variance_by_hand(theta, n, m):
    # Newcombe (2006) Method 5: Hanley-McNeil with Q1 = theta / (2 - theta), Q2 = 2 theta^2 / (1 + theta)
    # and N* = (n + m)/2 - 1 for both n - 1 and m - 1:
    # V = (theta (1 - theta) + N* (Q1 - theta^2) + N* (Q2 - theta^2)) / (n m)
    n_star = (n + m) / 2 - 1
    q1, q2 = theta / (2 - theta), 2 * theta**2 / (1 + theta)
    return (theta * (1 - theta) + n_star * (q1 - theta**2) + n_star * (q2 - theta**2)) / (n * m)


def test_newcombe_variance_by_hand():
    # n = m = 3, theta = 0.5: 0.25/9 * (1 + 2 (1/3 + 1/3)) = 0.0648148
    assert stats._newcombe_variance(0.5, 3, 3) == pytest.approx(0.0648148, abs=1e-7)
    for theta in (0.1, 0.5, 0.77, 0.95):
        for n, m in ((3, 3), (5, 5), (4, 10)):
            assert stats._newcombe_variance(theta, n, m) == pytest.approx(_newcombe_variance_by_hand(theta, n, m))


def test_newcombe_bounds_solve_the_score_equation():
    z = 1.959963985
    a, b = [1.0, 2.0, 3.0], [0.0, 0.0, 0.0]
    ci = probability_of_improvement(a, b, ci=True)  # one task: Newcombe by default
    assert ci.point == 1.0 and ci.high == 1.0
    # lower bound L: (1 - 1/18 - L)^2 = z^2 V(L), cc = 1 / (2 * 3 * 3)
    L = ci.low
    assert (1 - 1 / 18 - L) ** 2 == pytest.approx(z * z * _newcombe_variance_by_hand(L, 3, 3), rel=1e-7)
    assert 0.3 < L < 0.5  # three seeds that each beat all three: still no evidence at 95%
    ci = probability_of_improvement([0.2, 0.3, 0.4, 0.5, 0.9], [0.1, 0.3, 0.35, 0.4, 0.45], ci=True)
    # wins: 0.2 > 0.1 (1), 0.3: 1 + .5, 0.4: 1 + 1 + .5, 0.5: 5, 0.9: 5 -> 16 of 25 = 0.64
    assert ci.point == pytest.approx(0.64)
    cc = 1 / 50
    for bound in (ci.low, ci.high):
        gap = abs(0.64 - bound) - cc
        assert gap**2 == pytest.approx(z * z * _newcombe_variance_by_hand(bound, 5, 5), rel=1e-7)
    assert ci.low < 0.5 < ci.high


def test_newcombe_continuity_correction_keeps_half_in_at_three_seeds():
    # 3 vs 3 seeds, one side winning every pair: under no difference that happens 2 times in 20.
    # Without the correction, 0.5 would be outside: (1 - 0.5)^2 = 0.25 > z^2 V(0.5) = 3.8415 * 0.0648148 = 0.24898;
    # with it, (0.5 - 1/18)^2 = 0.1975 <= 0.24898.
    ci = probability_of_improvement([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], ci=True)
    assert ci.point == 0.0 and ci.low == 0.0 and ci.high > 0.5


def test_newcombe_accepted_set_is_one_interval():
    # the bisection assumes the accepted thetas form one interval around theta_hat: check on a grid
    grid = np.linspace(0, 1, 2001)
    for n, m in ((3, 3), (3, 5), (5, 5), (10, 10), (4, 12)):
        z2 = 1.959963985**2
        for wins in range(0, 2 * n * m + 1, 3):
            theta_hat = wins / (2 * n * m)
            gap = np.maximum(np.abs(theta_hat - grid) - 0.5 / (n * m), 0)
            ok = gap**2 <= z2 * _newcombe_variance_by_hand(grid, n, m)
            runs = np.flatnonzero(np.diff(ok.astype(int)) != 0)
            assert len(runs) <= 2, (n, m, theta_hat)
            assert ok[np.argmin(np.abs(grid - theta_hat))]  # and it holds theta_hat


def test_identical_seeds_give_half_with_a_symmetric_interval():
    ci = probability_of_improvement([0.7] * 5, [0.7] * 5, ci=True)
    assert ci.point == 0.5
    assert ci.low == pytest.approx(1 - ci.high) and ci.low < 0.2


# ---------------------------------------------------------------- batched = scalar


def test_batched_intervals_equal_the_scalar_ones():
    rng = np.random.default_rng(11)
    a, b = rng.beta(8, 2, size=(6, 5)), rng.beta(7, 3, size=(6, 5))
    batch = {
        "mean": stats.mean_intervals(a),
        "iqm": stats.iqm_intervals(a),
        "diff": stats.welch_intervals(a, b),
        "poi": stats.poi_intervals(a, b),
    }
    p = stats.welch_p_values(a, b)
    for i in range(6):
        for name, one in (
            ("mean", mean_ci(a[i])),
            ("iqm", iqm_ci(a[i])),
            ("diff", difference_ci(a[i], b[i])),
            ("poi", probability_of_improvement(a[i], b[i], ci=True)),
        ):
            assert tuple(one) == pytest.approx(tuple(x[i] for x in batch[name]), rel=1e-12), name
        assert stats.welch_p_value(a[i], b[i]) == pytest.approx(p[i], rel=1e-12)


# ---------------------------------------------------------------- Holm


def test_holm_by_hand():
    # sorted 0.005 < 0.05/4 = 0.0125 reject; 0.01 < 0.05/3 = 0.0167 reject; 0.03 > 0.05/2 = 0.025 stop
    p = [0.01, 0.04, 0.03, 0.005]
    assert stats.holm_reject(p).tolist() == [True, False, False, True]
    # adjusted: 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(1 x 0.04, 0.06) = 0.06
    assert stats.holm_adjusted(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # Bonferroni (0.0125 each) would reject only 0.005; unadjusted 0.05 would reject all four
    assert stats.holm_reject([0.03, 0.04], alpha=0.05).tolist() == [False, False]  # 0.03 > 0.025
    assert stats.holm_reject([0.02, 0.04]).tolist() == [True, True]  # 0.02 < 0.025, then 0.04 < 0.05


def test_holm_leaves_untested_out_of_the_family():
    adjusted = stats.holm_adjusted([0.01, float("nan"), 0.04])
    assert adjusted[0] == pytest.approx(0.02) and np.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.04)
    assert stats.holm_reject([0.01, float("nan"), 0.04]).tolist() == [True, False, True]
    assert stats.holm_adjusted([0.6, 0.7]).tolist() == [1.0, 1.0]  # capped at 1
    assert stats.holm_adjusted([]).size == 0
    with pytest.raises(ValueError):
        stats.holm_adjusted([1.5])
