"""`rlcompare.algos.objective`: the total loss equals its formula written out token by token, micro-batches sum to the
whole batch's loss, and the advantage pieces moved out of the trainer (overlong filter, KL in the reward, the
estimator choice) are the documented math."""

from __future__ import annotations

import math

import pytest
import torch

from rlcompare.algos import advantages as adv_lib
from rlcompare.algos import losses, objective

B, T, G = 4, 5, 2


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    mask[3, 1:] = 0
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(B, T, generator=g)).clamp(max=0)
    ref = (logp.detach() + 0.2 * torch.randn(B, T, generator=g)).clamp(max=0)
    ent = torch.rand(B, T, generator=g).requires_grad_()
    values = torch.randn(B, T, generator=g).requires_grad_()
    old_values = values.detach() + 0.5 * torch.randn(B, T, generator=g)
    returns = torch.randn(B, T, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return logp, old, ref, ent, values, old_values, returns, adv, mask


POLICY = losses.PolicySettings(surrogate="clip", ratio="token", eps_low=0.2, eps_high=0.28, dual_clip=None)


def _readable(
    logp, old, ref, ent, values, old_values, returns, adv, mask, *, beta, c_h, c_v, eps=(0.2, 0.28), clip_v=0.2
):
    """The token-mean total loss, one token at a time (docs/algorithms.md §3-5)."""
    n = float(mask.sum())
    policy = kl = entropy = value = 0.0
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            r = torch.exp(logp[i, t] - old[i, t])
            a = adv[i]
            policy = policy - torch.minimum(r * a, r.clamp(1 - eps[0], 1 + eps[1]) * a) / n
            x = ref[i, t] - logp[i, t]
            kl = kl + (torch.exp(x) - x - 1) / n
            entropy = entropy + ent[i, t] / n
            v_clipped = old_values[i, t] + (values[i, t] - old_values[i, t]).clamp(-clip_v, clip_v)
            value = (
                value + 0.5 * torch.maximum((values[i, t] - returns[i, t]) ** 2, (v_clipped - returns[i, t]) ** 2) / n
            )
    return policy + beta * kl - c_h * entropy + c_v * value


def _total(logp, old, ref, ent, values, old_values, returns, adv, mask, rows=slice(None), *, beta, c_h, c_v):
    norm = losses.Normalizers(total_tokens=float(mask.sum()), total_seqs=B, group_size=G)
    return objective.total_loss(
        logp[rows],
        old[rows],
        adv[rows],
        mask[rows],
        mask[rows],
        aggregation="token-mean",
        norm=norm,
        policy=POLICY,
        ref_logp=ref[rows],
        kl_coef=beta,
        kl_estimator="k3",
        kl_in_loss=True,
        entropy=ent[rows],
        entropy_coef=c_h,
        values=values[rows],
        old_values=old_values[rows],
        returns=returns[rows],
        value_coef=c_v,
        value_clip=0.2,
    )


def test_total_loss_equals_the_formula_token_by_token_value_and_gradient():
    x = _inputs()
    logp, _, _, ent, values = x[:5]
    loss, parts = _total(*x, beta=0.04, c_h=0.01, c_v=0.5)
    want = _readable(*x, beta=0.04, c_h=0.01, c_v=0.5)
    torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-6)
    # the parts add up to the loss
    torch.testing.assert_close(parts.policy + parts.kl + parts.entropy_bonus + 0.5 * parts.value, loss)
    got = torch.autograd.grad(loss, [logp, ent, values])
    expected = torch.autograd.grad(want, [logp, ent, values])
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_micro_batches_sum_to_the_whole_batch_loss():
    x = _inputs(1)
    whole, _ = _total(*x, beta=0.04, c_h=0.01, c_v=0.5)
    halves = sum(_total(*x, rows=rows, beta=0.04, c_h=0.01, c_v=0.5)[0] for rows in (slice(0, 2), slice(2, 4)))
    torch.testing.assert_close(halves, whole, atol=1e-6, rtol=1e-6)


def test_terms_that_are_off_are_absent():
    logp, old, ref, ent, _, _, _, adv, mask = _inputs()
    norm = losses.Normalizers(total_tokens=float(mask.sum()), total_seqs=B, group_size=G)
    loss, parts = objective.total_loss(
        logp,
        old,
        adv,
        mask,
        mask,
        aggregation="seq-mean-token-mean",
        norm=norm,
        policy=POLICY,
        ref_logp=ref,
        kl_in_loss=False,
        entropy=ent,
    )
    assert parts.kl is None and parts.entropy_bonus is None and parts.value is None
    assert parts.kl_ref == pytest.approx(float((losses.kl_divergence(logp, ref) * mask).sum() / mask.sum()))
    ploss, _ = losses.policy_loss(logp, old, adv, mask, POLICY, aggregation="seq-mean-token-mean", norm=norm)
    assert torch.equal(loss, ploss)


def test_overlong_filter_masks_truncated_rows_only_when_on():
    mask = torch.ones(3, 4, dtype=torch.long)
    truncated = torch.tensor([False, True, False])
    assert torch.equal(objective.loss_mask(mask, truncated, overlong_filter=False), mask)
    got = objective.loss_mask(mask, truncated, overlong_filter=True)
    assert got[1].sum() == 0 and got[0].sum() == 4 and mask[1].sum() == 4  # the input is not changed


def test_kl_in_the_reward_for_the_group_estimators_centres_the_penalised_sum():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    sampler = torch.tensor([[-0.5, -1.0, 0.0], [-0.2, -0.3, -0.4], [-1.0, 0.0, 0.0], [-0.1, -0.1, 0.0]])
    ref = sampler - 0.25
    kl = objective.reward_kl(sampler, ref, mask, estimator="k1")
    assert torch.allclose(kl, 0.25 * mask)  # k1 = log pi_old - log pi_ref on real tokens, 0 on padding
    beta = 0.5
    penalised = rewards - beta * kl.sum(-1)
    got = objective.advantages("group", rewards, mask, group_size=2, kl=kl, beta=beta)
    torch.testing.assert_close(got.advantages, adv_lib.group_advantages(penalised, 2))
    got = objective.advantages("rloo", rewards, mask, group_size=2, kl=kl, beta=beta)
    torch.testing.assert_close(got.advantages, adv_lib.rloo_advantages(penalised, 2))
    # without a KL tensor beta is ignored
    plain = objective.advantages("group", rewards, mask, group_size=2, beta=beta)
    torch.testing.assert_close(plain.advantages, adv_lib.group_advantages(rewards, 2))


def test_gae_needs_values_and_returns_them_with_the_returns():
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.0, -0.1, 0.0]])
    with pytest.raises(ValueError, match="critic"):
        objective.advantages("gae", rewards, mask, group_size=1)
    got = objective.advantages(
        "gae", rewards, mask, group_size=1, scale="none", values=values, gae_gamma=1.0, gae_lam=1.0
    )
    # gamma = lambda = 1: the advantage is the return to go (the outcome) minus the value
    want = torch.where(mask.bool(), rewards[:, None] - values, torch.zeros(()))
    torch.testing.assert_close(got.advantages, want)
    torch.testing.assert_close(got.returns, torch.where(mask.bool(), rewards[:, None].expand(2, 3), torch.zeros(())))
    assert got.old_values is values
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        objective.advantages("nope", rewards, mask, group_size=1)
    assert math.isfinite(float(got.advantages.sum()))
