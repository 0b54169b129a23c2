"""GDPO (arXiv 2601.05242): each reward component normalised within its group, then combined and whitened.

Checked by hand (the paper's two-reward toy case, docs/algorithms.md §1) and against verl's
`compute_gdpo_outcome_advantage` on the same inputs. verl is not installed here, so its function is copied below
as the reference, with the two verl helpers it calls, from their sources:
- `compute_grpo_outcome_advantage`: volcengine/verl, verl/trainer/ppo/core_algos.py (commit b178a3cd5, 2026-01-29);
- `masked_mean`, `masked_var`, `masked_whiten`: volcengine/verl, verl/utils/torch_functional.py (same commit);
- `compute_gdpo_outcome_advantage`: verl's core_algos.py as of its GDPO estimator
  (`@register_adv_est(AdvantageEstimator.GDPO)`, "Ref GDPO (https://arxiv.org/abs/2601.05242)"), after that
  commit; only the loop over the components and the whitening are kept (its reading of the components out of
  `non_tensor_batch` at the last real token is replaced by passing them in, which the loop sums back anyway).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from rlcompare.algos import objective
from rlcompare.algos.advantage.gdpo import gdpo_advantages


# ----------------------------------------------------------------------------- verl's functions (reference)
def _verl_masked_mean(values, mask, axis=None):
    return (values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


def _verl_masked_var(values, mask, unbiased=True):
    mean = _verl_masked_mean(values, mask)
    centered_values = values - mean
    variance = _verl_masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def _verl_masked_whiten(values, mask, shift_mean=True):
    mean, var = _verl_masked_mean(values, mask), _verl_masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def _verl_grpo(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def _verl_gdpo(score_list, response_mask, index, reward_weights, epsilon=1e-6):
    """verl's compute_gdpo_outcome_advantage, from `num_scores = len(score_list)` on."""
    num_scores = len(score_list)
    weights = torch.tensor(reward_weights, dtype=torch.float32)
    new_advantage = None
    for i in range(num_scores):
        normalized_score, _ = _verl_grpo(score_list[i], response_mask, index, epsilon=epsilon)
        if new_advantage is None:
            new_advantage = weights[i] * normalized_score
        else:
            new_advantage += weights[i] * normalized_score
    advantages = _verl_masked_whiten(new_advantage, response_mask) * response_mask
    return advantages, advantages


def _at_last_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) scores placed on each row's last real token (verl's token_level_scores)."""
    last = mask.sum(-1).long() - 1
    out = torch.zeros(mask.shape, dtype=torch.float32)
    out[torch.arange(len(values)), last] = values
    return out


# ----------------------------------------------------------------------------- by hand
def test_the_papers_two_reward_case_by_hand():
    """Two groups of G = 2, two binary rewards. Group A: rollouts (0, 0) and (1, 1); group B: (0, 0) and (1, 0).
    GRPO normalises the sums (0, 2) and (0, 1) to the same [-1/sqrt2, 1/sqrt2] in both groups (the paper's
    advantage collapse). GDPO: group A, each component [-1/sqrt2, 1/sqrt2] (sample std of (0, 1) is 1/sqrt2),
    summed [-sqrt2, sqrt2]; group B, the first [-1/sqrt2, 1/sqrt2], the second all equal, 0; whitened over
    the four one-token rows: mean 0, sample variance (2 + 2 + 0.5 + 0.5) / 3 = 5/3, so
    A = [-sqrt2, sqrt2, -1/sqrt2, 1/sqrt2] / sqrt(5/3) = [-1.09545, 1.09545, -0.54772, 0.54772]."""
    comps = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    mask = torch.ones(4, 1)
    got = gdpo_advantages(comps, (1.0, 1.0), mask, 2)
    want = torch.tensor([-1.09545, 1.09545, -0.54772, 0.54772])[:, None]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    grpo = objective.advantages("group", comps.sum(1), mask, group_size=2).advantages
    h = 1 / math.sqrt(2)
    torch.testing.assert_close(grpo, torch.tensor([-h, h, -h, h]), atol=2e-5, rtol=0)  # collapsed
    # without whitening (scale=none) the combined group advantages themselves
    raw = objective.advantages(
        "gdpo", comps.sum(1), mask, group_size=2, scale="none", components=comps, component_weights=(1.0, 1.0)
    )
    torch.testing.assert_close(raw.advantages, torch.tensor([[-2 * h], [2 * h], [-h], [h]]), atol=2e-5, rtol=0)


def test_the_worked_example_in_algorithms_md_is_the_one_checked_here():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    assert "A ≈ [−1.09545, 1.09545, −0.54772, 0.54772]" in doc and "GRPO normalises the sums (0, 2) and (0, 1)" in doc


def test_weights_scale_each_normalised_component():
    """Weights enter after normalisation: (1, 0.5) on group B's components, with the second now varying
    ((1, 0) and (0, 1)): [-h, h] + 0.5 [h, -h] = [-h/2, h/2], h = 1/sqrt2, before whitening."""
    comps = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    got = gdpo_advantages(comps, (1.0, 0.5), torch.ones(4, 1), 2, whiten=False)
    h = 1 / math.sqrt(2)
    torch.testing.assert_close(got[:, 0], torch.tensor([h / 2, -h / 2, -h / 2, h / 2]), atol=2e-5, rtol=0)


# ----------------------------------------------------------------------------- against verl
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gdpo_equals_verls_on_the_same_inputs(seed):
    """Three components of different scales, 3 groups of 4, rows of different lengths (the whitening is over
    real tokens, so a long row counts more, in both), one group flat in one component."""
    g = torch.Generator().manual_seed(seed)
    B, G, T = 12, 4, 5
    comps = torch.stack(
        [
            torch.randint(0, 2, (B,), generator=g).float(),  # correctness
            torch.rand(B, generator=g) * 10,  # a large-spread score
            torch.randint(0, 3, (B,), generator=g).float() * 0.1,  # a small format reward
        ],
        dim=1,
    )
    comps[:G, 0] = 1.0  # group 0 all correct: its first component carries no signal
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    weights = (1.0, 0.3, 2.0)
    index = np.repeat(np.arange(B // G), G)
    want, _ = _verl_gdpo([_at_last_token(comps[:, k], mask) for k in range(3)], mask, index, weights)
    got = objective.advantages(
        "gdpo",
        comps @ torch.tensor(weights),
        mask,
        group_size=G,
        scale="whiten",
        components=comps,
        component_weights=weights,
    ).advantages
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_one_reward_is_one_component_of_weight_one():
    """A verifier without components: GDPO is GRPO's group advantage, whitened (verl's fallback too)."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 2.0, 2.0])
    mask = torch.ones(6, 2)
    got = objective.advantages("gdpo", rewards, mask, group_size=3, scale="whiten").advantages
    want, _ = _verl_gdpo([_at_last_token(rewards, mask)], mask, np.repeat(np.arange(2), 3), (1.0,))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
