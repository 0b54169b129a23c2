"""ScaleRL's compute-performance fit (rlcompare.report.compute_fit) on synthetic curves with known parameters.

Every expected number comes from ../shared/docs/variants.md §11 (the worked values and the App. A.5
recovery) or from the parameters the synthetic curve was drawn with, never from the fit's own output.
"""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlcompare.report.compute_fit import (  # noqa: E402
    SeedCurve,
    difference_rows,
    fit_arms,
    fit_rows,
    fit_scalerl,
    scalerl_curve,
)

# variants.md §11: R0 0.4, A 0.65, B 1.7, C_mid 10k
R0, A, B, C_MID = 0.4, 0.65, 1.7, 10_000.0


def _truth(c, b=B, a=A, c_mid=C_MID):
    """The curve written out here, independent of the module: R0 + (A - R0) / (1 + (C_mid / C)^B)."""
    c = np.asarray(c, dtype=float)
    return R0 + (a - R0) / (1.0 + (c_mid / c) ** b)


def _noisy_seeds(rng, n_seeds, b=B, noise=0.02, rows=31, c_max=40_000.0):
    """Seeds of one known curve: row 0 the step-0 eval at R0, then evals with Gaussian noise."""
    c = np.linspace(0.0, c_max, rows)
    seeds = []
    for _ in range(n_seeds):
        acc = np.concatenate([[R0], _truth(c[1:], b=b) + rng.normal(0.0, noise, rows - 1)])
        seeds.append(SeedCurve(accuracy=np.clip(acc, 0.0, 1.0), tokens=c))
    return seeds


# ---------------------------------------------------------------- the curve


@pytest.mark.parametrize("c, expected", [(5_000, 0.458837), (10_000, 0.525), (20_000, 0.591163), (40_000, 0.628366)])
def test_curve_matches_the_worked_values(c, expected):
    assert scalerl_curve(c, R0, A, B, C_MID) == pytest.approx(expected, abs=5e-7)


def test_curve_starts_at_r0_and_reaches_half_the_gain_at_c_mid():
    out = scalerl_curve(np.array([0.0, C_MID, 1e12]), R0, A, B, C_MID)
    assert out[0] == R0  # (C_mid / 0)^B = inf: no gain yet
    assert out[1] == pytest.approx(R0 + (A - R0) / 2)
    assert out[2] == pytest.approx(A)


def test_curve_rejects_non_positive_b_and_c_mid():
    with pytest.raises(ValueError, match="B=0"):
        scalerl_curve(1.0, R0, A, 0.0, C_MID)
    with pytest.raises(ValueError, match="C_mid=-1"):
        scalerl_curve(1.0, R0, A, B, -1.0)


# ---------------------------------------------------------------- recovery, noise-free


def test_scalerl_linear_grid_recovers_the_documented_fit():
    # variants.md §11: ScaleRL's grid (A in {0.450, ..., 0.800}, 100 linear C_mid in [100, 40000]) recovers
    # A = 0.65, B = 1.7, C_mid ~ 9,773 from 30 noise-free points >= 1.5k. The doc does not say where the
    # points lie; 30 log-spaced in [1.5k, 100k] are used here. 10k is not on that C_mid grid: its
    # neighbours are 100 + 24 * 39,900 / 99 = 9,772.7 (the doc's) and 100 + 25 * 39,900 / 99 = 10,175.8,
    # and the fit must land on one of them.
    c = np.geomspace(1_500.0, 100_000.0, 30)
    fit = fit_scalerl(
        c,
        _truth(c),
        R0=R0,
        min_compute=1_500.0,
        A_grid=np.round(np.arange(0.45, 0.8 + 1e-9, 0.005), 3),
        C_mid_grid=np.linspace(100.0, 40_000.0, 100),
    )
    assert fit.identifiable, fit.reason
    assert fit.n_points == 30
    assert fit.A == pytest.approx(0.65, abs=1e-9)
    assert min(abs(fit.C_mid - (100 + k * 39_900 / 99)) for k in (24, 25)) < 1e-6
    assert fit.B == pytest.approx(1.7, abs=0.05)


@pytest.mark.parametrize("a_grid", [None, [0.5, 0.63, 0.65, 0.8, 0.95]], ids=["default", "uneven"])
def test_grid_holding_the_truth_recovers_it_exactly(a_grid):
    # C_mid = 10k on the grid and A = 0.65 on the A grid: only B is searched, and the SSE is 0 at B = 1.7
    c = np.linspace(2_000.0, 40_000.0, 20)
    fit = fit_scalerl(c, _truth(c), R0=R0, A_grid=a_grid, C_mid_grid=[5_000.0, 10_000.0, 20_000.0, 40_000.0])
    assert (fit.A, fit.C_mid) == (pytest.approx(0.65, abs=1e-12), 10_000.0)
    assert fit.B == pytest.approx(1.7, abs=1e-6)
    assert fit.sse < 1e-16


def test_default_grid_recovers_within_one_grid_step():
    # default C_mid grid: 100 log-spaced values over [1k, 40k], a ratio 40^(1/99) ~ 1.038 between neighbours
    c = np.linspace(0.0, 40_000.0, 41)
    fit = fit_scalerl(c, np.concatenate([[R0], _truth(c[1:])]), R0=R0)  # row 0: step 0, excluded
    assert fit.identifiable, fit.reason
    assert abs(math.log(fit.C_mid / C_MID)) <= math.log(40.0) / 99
    assert fit.A == pytest.approx(0.65, abs=0.005)  # one A step
    assert fit.B == pytest.approx(1.7, abs=0.1)


def test_reported_sse_is_the_sum_of_squared_residuals_of_the_returned_curve():
    rng = np.random.default_rng(3)
    c = np.linspace(1_000.0, 40_000.0, 25)
    r = np.clip(_truth(c) + rng.normal(0.0, 0.02, c.size), 0, 1)
    fit = fit_scalerl(c, r, R0=R0)
    kept = c >= 0.05 * 40_000.0
    assert fit.n_points == int(kept.sum())
    assert fit.sse == pytest.approx(
        float(np.sum((r[kept] - _truth(c[kept], b=fit.B, a=fit.A, c_mid=fit.C_mid)) ** 2)), rel=1e-9
    )


def test_early_points_below_min_compute_do_not_move_the_fit():
    c = np.linspace(1_000.0, 40_000.0, 40)
    r = _truth(c)
    spoiled = r.copy()
    spoiled[c < 5_000.0] = 0.0  # garbage where the rule says "excluded"
    grid = {"C_mid_grid": np.geomspace(1_000.0, 40_000.0, 100)}  # else the grid would move with the kept points
    clean = fit_scalerl(c, r, R0=R0, min_compute=5_000.0, **grid)
    dirty = fit_scalerl(c, spoiled, R0=R0, min_compute=5_000.0, **grid)
    assert clean.n_points == dirty.n_points == int(np.sum(c >= 5_000.0))
    assert (dirty.A, dirty.B, dirty.C_mid) == (clean.A, clean.B, clean.C_mid)


def test_points_in_any_order_give_the_same_fit():
    c = np.linspace(1_000.0, 40_000.0, 30)
    r = _truth(c, c_mid=120_000.0)  # not identifiable: the reason reads the largest compute
    forward, backward = fit_scalerl(c, r, R0=R0), fit_scalerl(c[::-1], r[::-1], R0=R0)
    assert (backward.A, backward.B, backward.C_mid, backward.reason) == (
        forward.A,
        forward.B,
        forward.C_mid,
        forward.reason,
    )


# ---------------------------------------------------------------- not identifiable


def test_flat_curve_is_not_identifiable():
    c = np.linspace(1_000.0, 40_000.0, 30)
    fit = fit_scalerl(c, np.full(c.size, R0), R0=R0)
    assert not fit.identifiable and fit.reason.startswith("flat")


def test_noisy_flat_curve_is_not_identifiable():
    rng = np.random.default_rng(0)
    c = np.linspace(1_000.0, 40_000.0, 30)
    fit = fit_scalerl(c, 0.5 + rng.normal(0.0, 0.02, c.size), R0=0.5)
    assert not fit.identifiable and fit.reason.startswith("flat")


def test_three_points_are_too_few():
    c = np.array([10_000.0, 20_000.0, 40_000.0])
    fit = fit_scalerl(c, _truth(c), R0=R0)
    assert not fit.identifiable and fit.reason.startswith("too few points")
    assert fit.n_points == 3 and math.isnan(fit.A)


def test_midpoint_beyond_the_observed_compute_is_not_identifiable():
    # C_mid = 120k, three times the last point: only the rising part is seen (gain 0.033 by 40k, not flat)
    c = np.linspace(1_000.0, 40_000.0, 30)
    fit = fit_scalerl(c, _truth(c, c_mid=120_000.0), R0=R0)
    assert not fit.identifiable
    assert fit.reason.startswith("C_mid at the top of its grid"), fit.reason


def test_asymptote_at_the_top_of_its_grid_is_not_identifiable():
    # A = 1.0 is the grid's top: a fit that wants more than perfect accuracy cannot say where it ends
    c = np.linspace(1_000.0, 40_000.0, 30)
    fit = fit_scalerl(c, _truth(c, a=1.0), R0=R0)
    assert not fit.identifiable and fit.reason.startswith("A at the edge"), fit.reason


def test_a_step_steeper_than_the_b_range_is_not_identifiable():
    # B = 60: the whole gain within a factor 81^(1/60) ~ 1.08 of C_mid, steeper than B's range [0.05, 20]
    c = np.linspace(1_000.0, 40_000.0, 30)
    fit = fit_scalerl(c, _truth(c, b=60.0), R0=R0)
    assert not fit.identifiable and fit.reason.startswith("B at the edge"), fit.reason


# ---------------------------------------------------------------- arms over seeds


def test_noisy_seeds_recover_the_curve_and_the_interval_holds_the_truth():
    rng = np.random.default_rng(0)
    res = fit_arms({"grpo": _noisy_seeds(rng, 5)}, reps=200, seed=0)
    arm = res.arms["grpo"]
    assert arm.n_seeds == 5 and arm.fit.identifiable, arm.fit.reason
    assert arm.fit.R0 == pytest.approx(R0)
    assert arm.fit.A == pytest.approx(A, abs=0.02)  # ScaleRL's error margin on A
    assert arm.fit.B == pytest.approx(B, rel=0.2)
    assert arm.fit.C_mid == pytest.approx(C_MID, rel=0.15)
    for name, truth in (("A", A), ("B", B), ("C_mid", C_MID)):
        iv = getattr(arm, name)
        assert iv.low <= truth <= iv.high, (name, iv)
        assert iv.low < iv.high


def test_seeds_on_different_compute_points_are_aligned_by_interpolation():
    # noise-free seeds of the same curve, each evaluated at its own token counts: the mean is the curve
    curves = []
    for offset in (0.0, 150.0, 400.0):
        c = np.concatenate([[0.0], np.linspace(1_000.0 + offset, 40_000.0 - offset, 40)])
        curves.append(SeedCurve(accuracy=np.concatenate([[R0], _truth(c[1:])]), tokens=c))
    fit = fit_arms({"a": curves}, reps=20).arms["a"].fit
    assert fit.identifiable, fit.reason
    assert fit.A == pytest.approx(A, abs=0.005)
    assert fit.B == pytest.approx(B, abs=0.1)
    assert fit.C_mid == pytest.approx(C_MID, rel=0.04)


def test_seconds_are_counted_from_the_step_0_eval():
    # 1,000 tokens per second after 7 s spent before the first eval: C_mid = 10 s
    c = np.linspace(0.0, 40_000.0, 41)
    curve = SeedCurve(accuracy=np.concatenate([[R0], _truth(c[1:])]), tokens=c, seconds=7.0 + c / 1_000.0)
    fit = fit_arms({"a": [curve]}, compute="seconds", reps=1).arms["a"].fit
    assert fit.C_mid == pytest.approx(10.0, rel=0.04)
    assert fit.A == pytest.approx(A, abs=0.005)


def test_one_seed_has_no_interval():
    c = np.linspace(0.0, 40_000.0, 31)
    arm = fit_arms({"a": [SeedCurve(np.concatenate([[R0], _truth(c[1:])]), c)]}, reps=50).arms["a"]
    assert arm.A.point == arm.fit.A
    assert math.isnan(arm.A.low) and math.isnan(arm.B.high)


def test_a_strong_difference_in_b_excludes_zero_and_the_same_curve_includes_it():
    rng = np.random.default_rng(1)
    arms = {
        "slow": _noisy_seeds(rng, 5, b=1.0),
        "fast": _noisy_seeds(rng, 5, b=3.0),
        "slow_again": _noisy_seeds(rng, 5, b=1.0),
    }
    res = fit_arms(arms, reps=200, seed=0, reference="slow")
    fast, same = res.differences["fast"], res.differences["slow_again"]
    assert fast.reference == "slow" and fast.identifiable
    assert fast.dB.low > 0  # true difference 3.0 - 1.0 = 2.0
    assert fast.dB.low <= 2.0 <= fast.dB.high
    assert same.dB.low <= 0 <= same.dB.high
    assert same.dA.low <= 0 <= same.dA.high
    assert "slow" not in res.differences


def test_rows_carry_the_fits_and_differences():
    rng = np.random.default_rng(2)
    res = fit_arms({"ref": _noisy_seeds(rng, 3), "other": _noisy_seeds(rng, 3, b=3.0)}, reps=30)
    rows = {r["variant"]: r for r in fit_rows(res)}
    assert rows["other"]["B"] == res.arms["other"].fit.B and rows["other"]["seeds"] == 3
    assert rows["ref"]["A_low"] == res.arms["ref"].A.low
    (d,) = difference_rows(res)
    assert (d["variant"], d["reference"]) == ("other", "ref")
    assert d["dB"] == pytest.approx(res.arms["other"].fit.B - res.arms["ref"].fit.B)


def test_bootstrap_is_deterministic_for_a_seed():
    arms = {"a": _noisy_seeds(np.random.default_rng(4), 4)}
    first, second = fit_arms(arms, reps=40, seed=7), fit_arms(arms, reps=40, seed=7)
    assert first.arms["a"].B == second.arms["a"].B


# ---------------------------------------------------------------- bad input


def test_bad_input_names_the_setting():
    c = np.linspace(0.0, 40_000.0, 11)
    good = SeedCurve(np.concatenate([[R0], _truth(c[1:])]), c)
    with pytest.raises(ValueError, match="compute='flops'.*'tokens', 'seconds'"):
        fit_arms({"a": [good]}, compute="flops")
    with pytest.raises(ValueError, match="no seconds column"):
        fit_arms({"a": [good]}, compute="seconds")
    with pytest.raises(ValueError, match="reps=0"):
        fit_arms({"a": [good]}, reps=0)
    with pytest.raises(ValueError, match="'b'"):
        fit_arms({"a": [good]}, reference="b")
    with pytest.raises(ValueError, match="strictly increase"):
        fit_arms({"a": [SeedCurve(good.accuracy, c[::-1])]})
    with pytest.raises(ValueError, match="R0=1.5"):
        fit_scalerl(c, good.accuracy, R0=1.5)
    with pytest.raises(ValueError, match=r"accuracy in \[0, 1\]"):
        fit_scalerl(c, good.accuracy * 3, R0=R0)
    with pytest.raises(ValueError, match="11 values and R 10"):
        fit_scalerl(c, good.accuracy[1:], R0=R0)
