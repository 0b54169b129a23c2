"""pass@k, pass^k, maj@k and avg@n against numbers worked by hand and exact fractions (rlcompare.passk)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from rlcompare import passk


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_one_correct_of_four_at_k4_is_certain_where_verls_best_at_k_gave_0_684():
    # every 4-subset of 4 samples holds the correct one: pass@4 = 1 exactly. verl's bootstrap best@k (PR #7240)
    # resampled with replacement: 1 - (3/4)^4 = 0.684
    assert passk.pass_at_k(4, 1, 4) == 1.0
    assert round(1 - (3 / 4) ** 4, 3) == 0.684


def test_hand_worked_values():
    assert passk.pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert passk.pass_at_k(5, 2, 1) == pytest.approx(0.4)  # k=1 is c/n
    assert passk.pass_at_k(5, 0, 3) == 0.0
    assert passk.pass_at_k(5, 5, 1) == 1.0
    assert passk.pass_hat_k(5, 2, 2) == pytest.approx(0.1)  # C(2,2)/C(5,2) = 1/10
    assert passk.pass_hat_k(5, 3, 2) == pytest.approx(0.3)  # C(3,2)/C(5,2) = 3/10
    assert passk.pass_hat_k(5, 1, 2) == 0.0
    assert passk.pass_hat_k(4, 4, 4) == 1.0
    # two prompts: (c=1 of 4) and (c=3 of 4) at k=2: pass@2 = (1 - 3/6 + 1 - 0) / 2 = 0.75; pass^2 = (0 + 3/6)/2
    assert passk.mean_pass_at_k([4, 4], [1, 3], 2) == pytest.approx(0.75)
    assert passk.mean_pass_hat_k([4, 4], [1, 3], 2) == pytest.approx(0.25)
    assert passk.avg_at_n([4, 8], [1, 6]) == pytest.approx((0.25 + 0.75) / 2)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1024, 2048])
def test_exact_against_fractions_up_to_large_n(n):
    for c in sorted({0, 1, 2, n // 3, n // 2, n - 1, n}):
        for k in sorted({1, 2, n // 4 or 1, n // 2 or 1, n}):
            if not 0 <= c <= n or k > n:
                continue
            want = exact_pass_at_k(n, c, k)
            got = passk.pass_at_k(n, c, k)
            assert abs(got - float(want)) <= 1e-12, (n, c, k)
            want_hat = Fraction(math.comb(c, k), math.comb(n, k))
            assert abs(passk.pass_hat_k(n, c, k) - float(want_hat)) <= 1e-12 * max(1.0, float(want_hat)), (n, c, k)


def test_pass_at_k_is_monotone_in_k_and_bounds_hold():
    n, c = 64, 5
    values = [passk.pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert values[0] == pytest.approx(c / n)
    assert all(passk.pass_hat_k(n, c, k) <= passk.pass_at_k(n, c, k) for k in range(1, n + 1))


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="k=5"):
        passk.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        passk.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="one of each per prompt"):
        passk.mean_pass_at_k([4, 4], [1], 1)
    with pytest.raises(ValueError, match="prompt 1"):
        passk.avg_at_n([4, 4], [1, 9])


def test_majority_vote_first_k_and_its_tie_rule():
    answers = ["3", "5", "5", None, "3", "3"]
    correct = [True, False, False, False, True, True]
    assert passk.majority_correct(answers, correct, 1) is True  # "3"
    # first 3: "5" twice beats "3" once
    assert passk.majority_correct(answers, correct, 3) is False
    # first 5: "3" 2 votes, "5" 2 votes (None does not vote): a tie, "3" appeared first
    assert passk.majority_correct(answers, correct, 5) is True
    assert passk.majority_correct(["5", "3", "3", "5"], [False, True, True, False], 4) is False  # tie: "5" first
    assert passk.majority_correct([None, None], [False, False], 2) is False  # no answer: wrong


def test_default_ks_are_powers_of_two_up_to_n():
    assert passk.default_ks(1) == [1]
    assert passk.default_ks(16) == [1, 2, 4, 8, 16]
    assert passk.default_ks(20) == [1, 2, 4, 8, 16]


def test_crossing_k_in_log2_k():
    ks = [1, 2, 4, 8]
    # the arm is above at 1 and 2 (by 0.2, 0.1), then below at 4 (-0.1): crosses halfway between log2 2 and 4
    assert passk.crossing_k(ks, [0.5, 0.6, 0.7, 0.8], [0.3, 0.5, 0.8, 0.9]) == pytest.approx(2**1.5)
    assert passk.crossing_k(ks, [0.5, 0.6, 0.9, 1.0], [0.3, 0.5, 0.8, 0.9]) is None  # always above
    assert passk.crossing_k(ks, [0.1, 0.2, 0.3, 0.4], [0.3, 0.5, 0.8, 0.9]) is None  # never above
