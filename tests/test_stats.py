"""Hand-worked checks of rlcompare.stats (rliable definitions, pure numpy)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlcompare import stats  # noqa: E402
from rlcompare.stats import (  # noqa: E402
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


def test_poi_interval():
    ci = probability_of_improvement([1, 2, 3], [0, 0, 0], ci=True)
    assert isinstance(ci, Interval)
    assert (ci.point, ci.low, ci.high) == (1.0, 1.0, 1.0)
    ci = probability_of_improvement([0.2, 0.3, 0.4, 0.5], [0.1, 0.3, 0.35, 0.4], ci=True, seed=3)
    assert 0.0 <= ci.low <= ci.point <= ci.high <= 1.0
    assert ci.width > 0
    assert ci == probability_of_improvement([0.2, 0.3, 0.4, 0.5], [0.1, 0.3, 0.35, 0.4], ci=True, seed=3)


def test_poi_bootstrap_matches_explicit_resampling():
    # the count-weighted shortcut must equal recomputing PoI on resampled arrays
    a = np.array([0.1, 0.5, 0.5, 0.9])
    b = np.array([0.2, 0.5, 0.7])
    reps = 50
    ci = probability_of_improvement(a, b, ci=True, reps=reps, seed=7)
    rng = np.random.default_rng(7)
    ia = rng.integers(0, a.size, size=(reps, a.size))
    ib = rng.integers(0, b.size, size=(reps, b.size))
    boots = [probability_of_improvement(a[ia[r]], b[ib[r]]) for r in range(reps)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    assert ci.low == pytest.approx(lo) and ci.high == pytest.approx(hi)


# ---------------------------------------------------------------- bootstrap intervals


def test_mean_ci_contains_mean_and_is_deterministic():
    x = [0.2, 0.3, 0.4]
    ci = mean_ci(x)
    assert ci.point == pytest.approx(0.3)
    assert 0.2 - 1e-12 <= ci.low <= 0.3 <= ci.high <= 0.4 + 1e-12
    assert mean_ci(x) == ci  # same seed -> same interval
    # with 3 seeds, P(all draws = min) = 1/27 > 2.5%: the 95% interval is exactly [min, max]
    assert ci.low == pytest.approx(0.2) and ci.high == pytest.approx(0.4)
    y = np.random.default_rng(0).normal(size=12)
    assert mean_ci(y, seed=1) == mean_ci(y, seed=1)
    assert mean_ci(y, seed=1) != mean_ci(y, seed=2)


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
    assert stratified_bootstrap_ci(m, stats.iqm, reps=300, seed=5) == stratified_bootstrap_ci(m, "iqm", reps=300, seed=5)


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


def test_difference_interval_brackets_point_and_flips_sign():
    a, b = [0.5, 0.6, 0.7], [0.2, 0.3, 0.4]
    d = difference_ci(a, b)
    assert d.point == pytest.approx(0.3)
    # extremes of independent resampling: 0.5-0.4=0.1 .. 0.7-0.2=0.5
    assert 0.1 - 1e-12 <= d.low <= 0.3 <= d.high <= 0.5 + 1e-12
    r = difference_ci(b, a)
    assert r.point == pytest.approx(-0.3)
    assert difference_ci(a, b) == d  # deterministic


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
    assert imported <= {"__future__", "typing", "numpy"}
