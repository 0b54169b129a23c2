"""Aggregations, normalizers and corrections on multi-turn episodes (#51): the loss mask has holes where the
environment spoke. Every number below is worked by hand on this batch of two episodes of one group:

    episode 0 (two turns):  policy  policy  ENV  ENV  policy      per-token loss  1  2  10  20  3
    episode 1 (one turn):   policy  policy  pad  pad  pad                         4  5   -   -  -

The environment's tokens carry large losses (10, 20): any aggregation that counted them would show it."""

from __future__ import annotations

import math

import pytest
import torch

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos import losses, objective
from rlcompare.rollout import Completions

MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])  # every real token (the forward attends to all of them)
ENV = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])
LOSS = torch.tensor([[1.0, 2.0, 10.0, 20.0, 3.0], [4.0, 5.0, 0.0, 0.0, 0.0]])


def _episodes() -> Completions:
    ids = torch.arange(10).view(2, 5)
    return Completions(ids, MASK, torch.zeros(2, 5), torch.tensor([False, False]), torch.tensor([3, 2]), env_mask=ENV)


def test_the_policy_mask_is_the_mask_less_the_environment_tokens():
    assert _episodes().policy_mask.tolist() == [[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]]
    single = Completions(torch.zeros(2, 5, dtype=torch.long), MASK, None, torch.tensor([0, 0]).bool(), MASK.sum(1))
    assert single.policy_mask is single.mask  # single-turn: the very tensor, so nothing downstream changes


def test_token_mean_counts_the_policy_tokens_only():
    # (1 + 2 + 3 + 4 + 5) / 5 policy tokens = 3; counting the environment's would give 45 / 7
    got = losses.aggregate(LOSS, _episodes().policy_mask, "token-mean")
    assert float(got) == pytest.approx(3.0)


def test_seq_mean_token_mean_averages_each_episode_over_its_policy_tokens():
    # episode 0: (1 + 2 + 3) / 3 = 2; episode 1: (4 + 5) / 2 = 4.5; mean over 2 episodes = 3.25
    got = losses.aggregate(LOSS, _episodes().policy_mask, "seq-mean-token-mean")
    assert float(got) == pytest.approx(3.25)


def test_seq_mean_token_sum_norm_divides_by_the_budget_not_the_episode_width():
    # (1 + 2 + 3) + (4 + 5) = 15, over B * H = 2 * 8 = 16
    got = losses.aggregate(LOSS, _episodes().policy_mask, "seq-mean-token-sum-norm", horizon=8)
    assert float(got) == pytest.approx(15 / 16)


def test_token_sum_seq_mean_token_sum_and_prompt_mean():
    m = _episodes().policy_mask
    assert float(losses.aggregate(LOSS, m, "token-sum")) == pytest.approx(15.0)
    assert float(losses.aggregate(LOSS, m, "seq-mean-token-sum")) == pytest.approx(7.5)  # 15 / 2 episodes
    # one group of 2: its 5 policy tokens, one prompt: 15 / 5
    assert float(losses.aggregate(LOSS, m, "prompt-mean-token-mean", group_size=2)) == pytest.approx(3.0)


def test_micro_batches_with_the_whole_batch_normalizers_sum_to_the_whole():
    # each episode alone, with the batch's totals (5 policy tokens, 2 episodes): 6/5 + 9/5 = 3 (token-mean)
    m = _episodes().policy_mask
    parts = [losses.aggregate(LOSS[i : i + 1], m[i : i + 1], "token-mean", total_tokens=5) for i in (0, 1)]
    assert float(sum(parts)) == pytest.approx(3.0)
    parts = [losses.aggregate(LOSS[i : i + 1], m[i : i + 1], "seq-mean-token-mean", total_seqs=2) for i in (0, 1)]
    assert float(sum(parts)) == pytest.approx(3.25)


def test_the_loss_mask_and_dapo_overlong_filter_keep_the_holes():
    c = _episodes()
    assert objective.loss_mask(c.policy_mask, c.truncated, overlong_filter=False).tolist() == [
        [1, 1, 0, 0, 1],
        [1, 1, 0, 0, 0],
    ]
    cut = objective.loss_mask(c.policy_mask, torch.tensor([True, False]), overlong_filter=True)
    assert cut.tolist() == [[0, 0, 0, 0, 0], [1, 1, 0, 0, 0]]  # an episode that never ended: all of it out


def test_group_advantages_compare_whole_episodes_and_reach_the_policy_tokens_only():
    # rewards 1 and 0 in one group: mean 0.5, std (ddof 1) = sqrt(0.5); A = +-0.5 / sqrt(0.5) = +-0.7071
    a = adv_lib.group_advantages(torch.tensor([1.0, 0.0]), 2, eps=0.0)
    assert a.tolist() == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)])
    # on-policy GRPO per token: -A (ratio 1); token-mean over the 5 policy tokens: (-3 A + 2 A) / 5 = -A / 5
    settings = losses.PolicySettings.from_knobs(surrogate="clip", ratio="token", eps_low=0.2, eps_high=0.2)
    logp = torch.full((2, 5), -1.0) * _episodes().policy_mask
    loss, _ = losses.policy_loss(logp, logp.detach(), a, _episodes().policy_mask, settings, aggregation="token-mean")
    assert float(loss) == pytest.approx(-math.sqrt(0.5) / 5)


def test_gae_carries_across_the_environment_tokens():
    # gamma = lam = 1, values 0: every policy token's advantage is the return to go, the score at the episode's
    # last policy token: 1 on episode 0's three policy tokens, 0 at its environment tokens (holes)
    m = _episodes().policy_mask
    r = adv_lib.outcome_token_rewards(torch.tensor([1.0, 0.0]), m)
    assert r.tolist()[0] == [0.0, 0.0, 0.0, 0.0, 1.0]
    advs, _ = adv_lib.gae_advantages(r, torch.zeros(2, 5), m)
    assert advs.tolist()[0] == [1.0, 1.0, 0.0, 0.0, 1.0]
    # with a value of 0.5 on every token: delta at the last policy token 1 - 0.5 = 0.5; at the token before it the
    # next *policy* value (0.5, across the hole) is used: 0 + 0.5 - 0.5 = 0, A = 0 + 0.5 = 0.5
    advs, _ = adv_lib.gae_advantages(r, torch.full((2, 5), 0.5) * m, m)
    assert advs.tolist()[0] == pytest.approx([0.5, 0.5, 0.0, 0.0, 0.5])


def test_mismatch_weights_and_kl_ignore_the_environment_tokens():
    m = _episodes().policy_mask.float()
    new = torch.tensor([[-1.0, -1.0, -9.0, -9.0, -1.0], [-1.0, -1.0, 0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.5, -1.0, 0.0, 0.0, -1.0], [-1.0, -1.0, 0.0, 0.0, 0.0]])
    # k1 = new - old on policy tokens: 0.5 at (0, 0), else 0; the environment tokens' -9 is not counted
    kl = objective.reward_kl(new, old, m, estimator="k1")
    assert kl.tolist()[0] == pytest.approx([0.5, 0.0, 0.0, 0.0, 0.0])
    # trainer's (new) over the sampler's (old): rho = exp(-1 + 1.5) = exp(0.5) = 1.6487 at (0, 0), under c_max = 2;
    # 1 at the other policy tokens; 0 at the holes, though exp(-9 - 0) there would be a weight of 1.2e-4
    w, _ = losses.mismatch_weights(new, old, m, mode="token-truncate", c_max=2.0)
    assert w.tolist()[0] == pytest.approx([math.exp(0.5), 1.0, 0.0, 0.0, 1.0], abs=1e-6)
