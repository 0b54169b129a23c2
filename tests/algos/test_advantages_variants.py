"""The advantage variants of issue 19: ScaleRL's batch-centered scale, Lite PPO's batch scale, REINFORCE++ and
REINFORCE++-baseline, KL in the reward for every estimator -- against the worked numbers of variants.md §5-6 and
an independent loop."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlcompare.algos.advantages import (
    GROUP_SCALES,
    group_advantages,
    outcome_token_rewards,
    reinforce_pp_advantages,
    whiten,
)

# ---------------------------------------------------------------- the batch normalisations (variants.md §6)
# R = [1, 0, 0, 1], G = 2: GRPO +-0.707107; Lite PPO (std of R over the batch, ddof 1) +-0.866024 (eps 1e-6);
# ScaleRL (std of the centred A' = [0.5, -0.5, -0.5, 0.5]) +-1 (ddof 0), +-0.866025 (ddof 1)

R = torch.tensor([1.0, 0.0, 0.0, 1.0])


def test_batch_normalisations_worked_example():
    signs = [1, -1, -1, 1]
    assert group_advantages(R, 2, eps=0.0).tolist() == pytest.approx([s * 0.707107 for s in signs], abs=1e-6)
    assert group_advantages(R, 2, scale="batch").tolist() == pytest.approx([s * 0.866024 for s in signs], abs=1e-6)
    assert group_advantages(R, 2, scale="batch", eps=1e-4).tolist() == pytest.approx(
        [s * 0.865875 for s in signs], abs=1e-6
    )
    assert group_advantages(R, 2, scale="batch-centered", std_ddof=0, eps=0.0).tolist() == pytest.approx(
        signs, abs=1e-9
    )
    assert group_advantages(R, 2, scale="batch-centered", std_ddof=1, eps=0.0).tolist() == pytest.approx(
        [s * 0.866025 for s in signs], abs=1e-6
    )


def test_batch_centered_differs_from_batch_when_group_means_differ():
    # groups [0, 1 | 2, 2]: centred [-0.5, 0.5, 0, 0]. Lite PPO: std of the raw rewards (mean 1.25, sum of squared
    # deviations 2.75, ddof 1 -> 0.957427); ScaleRL: std of the centred values (mean 0, sum 0.5 -> 0.408248)
    r = torch.tensor([0.0, 1.0, 2.0, 2.0])
    lite = group_advantages(r, 2, scale="batch", eps=0.0)
    scalerl = group_advantages(r, 2, scale="batch-centered", eps=0.0)
    assert lite.tolist() == pytest.approx([-0.5 / math.sqrt(2.75 / 3), 0.5 / math.sqrt(2.75 / 3), 0, 0], abs=1e-6)
    assert scalerl.tolist() == pytest.approx([-0.5 / math.sqrt(0.5 / 3), 0.5 / math.sqrt(0.5 / 3), 0, 0], abs=1e-6)


def test_one_group_lite_ppo_is_grpo():
    r = torch.tensor([0.3, 1.0, -2.0, 0.5])
    assert torch.allclose(group_advantages(r, 4, scale="batch"), group_advantages(r, 4, scale="group"), atol=1e-7)


@pytest.mark.parametrize("scale", GROUP_SCALES)
def test_every_scale_gives_exact_zeros_for_flat_groups(scale):
    A = group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0, 3.0, 3.0]), 2, scale=scale)
    assert A[:2].tolist() == [0.0, 0.0] and A[4:].tolist() == [0.0, 0.0] and A[2] != 0


# ---------------------------------------------------------------- REINFORCE++ (variants.md §5)


def test_reinforce_pp_worked_example():
    # scores [1, 0], kl [[0.1, 0.2, 0.3], [0, -0.1, 0.1]], beta 0.1: returns [[0.94, 0.95, 0.97], [0, 0, -0.01]],
    # token mean 0.475, sum of squared deviations 1.37335
    scores = torch.tensor([1.0, 0.0], dtype=torch.float64)
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.0, -0.1, 0.1]], dtype=torch.float64)
    mask = torch.ones(2, 3)
    rewards = outcome_token_rewards(scores, mask, kl=kl, beta=0.1)
    assert rewards.tolist() == [pytest.approx([-0.01, -0.02, 0.97]), pytest.approx([0.0, 0.01, -0.01])]
    verl = reinforce_pp_advantages(scores, mask, kl=kl, beta=0.1)  # Bessel std 0.524090
    assert verl.tolist() == [
        pytest.approx([0.887253, 0.906333, 0.944495], abs=1e-6),
        pytest.approx([-0.906333, -0.906333, -0.925414], abs=1e-6),
    ]
    openrlhf = reinforce_pp_advantages(scores, mask, kl=kl, beta=0.1, std_ddof=0)  # population std 0.478426
    assert openrlhf.tolist() == [
        pytest.approx([0.971937, 0.992839, 1.034642], abs=1e-6),
        pytest.approx([-0.992839, -0.992839, -1.013740], abs=1e-6),
    ]


def test_reinforce_pp_baseline_worked_example():
    # 2 prompts x G = 2, lengths [3, 1, 2, 3], R = [1, 0, 0, 1] -> A' = [0.5, -0.5, -0.5, 0.5]; over the 9 tokens
    # the mean is 1/6, deviations 1/3 (6 tokens) and -2/3 (3 tokens), sum of squares 2
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    verl = reinforce_pp_advantages(R, mask, baseline="group", group_size=2)  # std sqrt(2/8) = 0.5
    pos, neg = 2 / 3, -4 / 3
    assert verl.tolist() == [
        pytest.approx([pos] * 3, abs=1e-6),
        pytest.approx([neg, 0, 0], abs=1e-6),
        pytest.approx([neg, neg, 0], abs=1e-6),
        pytest.approx([pos] * 3, abs=1e-6),
    ]
    openrlhf = reinforce_pp_advantages(R, mask, baseline="group", group_size=2, std_ddof=0)  # std sqrt(2/9)
    assert openrlhf[0, 0].item() == pytest.approx(0.707107, abs=1e-6)
    assert openrlhf[1, 0].item() == pytest.approx(-1.414214, abs=1e-6)


def test_reinforce_pp_limits():
    # beta = 0 with an outcome reward: every token of row i carries R_i (whitened): batch-normalised REINFORCE
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    scores = torch.tensor([2.0, -1.0, 0.5])
    A = reinforce_pp_advantages(scores, mask)
    want = whiten(scores.unsqueeze(-1).expand(3, 3).clone(), mask)
    assert torch.allclose(A, want, atol=1e-7)
    # baseline variant, equal lengths, no flat group, ddof 0 == ScaleRL's batch-centered (ddof 0), per token
    full = torch.ones(4, 5)
    r = torch.tensor([1.0, 0.0, 0.3, 0.9])
    A = reinforce_pp_advantages(r, full, baseline="group", group_size=2, std_ddof=0, eps=0.0)
    scalerl = group_advantages(r, 2, scale="batch-centered", std_ddof=0, eps=0.0)
    assert torch.allclose(A, scalerl.unsqueeze(-1).expand(4, 5), atol=1e-6)


def _reference_returns(token_rewards, mask, gamma):
    """Per row, walking back over the real tokens only (padding skipped)."""
    B, T = mask.shape
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if mask[i, t]:
                running = token_rewards[i][t] + gamma * running
                out[i][t] = running
    return out


def _reference_whiten(values, mask, ddof, eps):
    real = [(i, t) for i in range(len(values)) for t in range(len(values[0])) if mask[i, t]]
    mean = sum(values[i][t] for i, t in real) / len(real)
    var = sum((values[i][t] - mean) ** 2 for i, t in real) / (len(real) - ddof)
    return [
        [(values[i][t] - mean) / math.sqrt(var + eps) if mask[i, t] else 0.0 for t in range(len(values[0]))]
        for i in range(len(values))
    ]


def test_reinforce_pp_against_an_independent_loop():
    g = torch.Generator().manual_seed(0)
    B, T, G = 6, 7, 3
    for gamma, ddof, beta in itertools.product((1.0, 0.9), (0, 1), (0.0, 0.05)):
        mask = torch.rand(B, T, generator=g) < 0.7
        mask[:, 0] = True
        scores = torch.randn(B, generator=g, dtype=torch.float64)
        kl = torch.randn(B, T, generator=g, dtype=torch.float64)
        A = reinforce_pp_advantages(scores, mask, kl=kl, beta=beta, gamma=gamma, std_ddof=ddof)
        # the score sits on each row's last real token; -beta kl on every real token
        last = [max(t for t in range(T) if mask[i, t]) for i in range(B)]
        tr = [
            [
                (float(scores[i]) if t == last[i] else 0.0) - (beta * float(kl[i, t]) if mask[i, t] else 0.0)
                for t in range(T)
            ]
            for i in range(B)
        ]
        want = _reference_whiten(_reference_returns(tr, mask, gamma), mask, ddof, 1e-8)
        assert A.tolist() == [pytest.approx(row, abs=1e-9) for row in want]
        if gamma == 1.0:
            seq = [sum(tr[i][t] for t in range(T) if mask[i, t]) for i in range(B)]
            centred = [seq[i] - sum(seq[(i // G) * G : (i // G + 1) * G]) / G for i in range(B)]
            want = _reference_whiten(
                [[centred[i] if mask[i, t] else 0.0 for t in range(T)] for i in range(B)], mask, ddof, 1e-8
            )
            got = reinforce_pp_advantages(scores, mask, kl=kl, beta=beta, baseline="group", group_size=G, std_ddof=ddof)
            assert got.tolist() == [pytest.approx(row, abs=1e-9) for row in want]


# ---------------------------------------------------------------- KL in the reward, for every estimator


def test_kl_in_the_reward_for_group_estimators_is_the_summed_penalty():
    # verl's GRPO with use_kl_in_reward: token_level_rewards.sum(-1) = score - beta sum_t kl_t
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]])
    kl = torch.tensor([[0.5, 1.0, 99.0], [0.2, 0.2, 0.2], [2.0, 99.0, 99.0], [9.0, 9.0, 9.0]])
    summed = outcome_token_rewards(scores, mask, kl=kl, beta=0.1).sum(-1)
    # padding never counts; the empty row gets neither score nor penalty
    assert summed.tolist() == pytest.approx([1 - 0.15, -0.06, 1 - 0.2, 0.0])


def test_outcome_token_rewards_put_the_score_on_the_last_real_token():
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0]])  # a hole before the first real token, right padding
    r = outcome_token_rewards(torch.tensor([3.0, -1.0]), mask)
    assert r.tolist() == [[0, 0, 3.0, 0], [-1.0, 0, 0, 0]]


def test_reinforce_pp_bad_settings():
    mask = torch.ones(4, 2)
    with pytest.raises(ValueError, match=r"baseline must be one of 'none', 'group', got 'rloo'"):
        reinforce_pp_advantages(R, mask, baseline="rloo")
    with pytest.raises(ValueError, match=r"baseline='group' needs group_size"):
        reinforce_pp_advantages(R, mask, baseline="group")
    with pytest.raises(ValueError, match=r"baseline='group' needs gamma=1"):
        reinforce_pp_advantages(R, mask, baseline="group", group_size=2, gamma=0.9)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        reinforce_pp_advantages(R, mask, gamma=1.5)
    with pytest.raises(ValueError, match=r"beta must be >= 0"):
        outcome_token_rewards(R, mask, kl=mask, beta=-1.0)
    with pytest.raises(ValueError, match=r"scores must be \[B\] = \(4,\)"):
        outcome_token_rewards(torch.ones(3), mask)
