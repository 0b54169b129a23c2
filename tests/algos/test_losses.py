"""Losses against hand-worked numbers, the papers' examples and an independent loop."""

import itertools
import math

import pytest
import torch

from rlcompare.algos.losses import (
    AGGREGATIONS,
    aggregate,
    aggregation_weights,
    entropy_from_logits,
    kl_divergence,
    log_ratio,
    overlong_penalty,
    value_loss,
)
from tests.algos.loss_kwargs import policy_loss

RATIOS = ["token", "sequence", "sequence-token", "hybrid"]
SEQ_EPS = dict(seq_eps_low=0.05, seq_eps_high=0.08)


def one_token(rho, adv, **kw):
    """policy_loss on a single token with ratio rho; returns (loss, grad wrt logp, metrics)."""
    logp = torch.tensor([[math.log(rho)]], dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(
        logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1), **kw
    )
    loss.backward()
    return loss.item(), logp.grad.item(), metrics


# ---------------------------------------------------------------- worked examples (algorithms.md §3)


def test_ppo_worked_example_clipped_low():
    # rho 0.7, A -2.1, eps 0.2: min(0.7*-2.1 = -1.47, 0.8*-2.1 = -1.68) = -1.68 (clipped branch)
    loss, grad, m = one_token(0.7, -2.1, eps_low=0.2, eps_high=0.2)
    assert -loss == pytest.approx(-1.68, abs=1e-9)
    assert grad == 0.0
    assert m["clip_frac_low"] == 1.0 and m["clip_frac_high"] == 0.0


def test_dapo_clip_higher_worked_example():
    # rho 1.35, A +1.43: [0.8, 1.28] -> 1.28 * 1.43 = 1.8304; symmetric 1.2 * 1.43 = 1.716
    loss, grad, m = one_token(1.35, 1.43, eps_low=0.2, eps_high=0.28)
    assert -loss == pytest.approx(1.8304, abs=1e-9)
    assert grad == 0.0 and m["clip_frac_high"] == 1.0
    loss, _, _ = one_token(1.35, 1.43, eps_low=0.2, eps_high=0.2)
    assert -loss == pytest.approx(1.716, abs=1e-9)


def test_unclipped_gradient():
    # rho 1.1, A 1: l = -rho*A, dl/dlogp = -rho*A = -1.1 (d rho / d logp = rho)
    loss, grad, m = one_token(1.1, 1.0)
    assert loss == pytest.approx(-1.1) and grad == pytest.approx(-1.1)
    assert m["clip_frac_low"] == m["clip_frac_high"] == 0.0
    # pessimistic side: rho 0.7, A +1 -> min(0.7, 0.8) = 0.7 unclipped, gradient flows
    loss, grad, _ = one_token(0.7, 1.0)
    assert loss == pytest.approx(-0.7) and grad == pytest.approx(-0.7)


# ---------------------------------------------------------------- dual clip and metrics, hand-counted


def test_dual_clip_and_fractions_hand_counted():
    # token: (rho, A) -> per-token loss with eps 0.2, c = 3
    #  1 (0.5, -1): max(0.5, 0.8) = 0.8, clipped low                  grad 0
    #  2 (0.5, +1): -min(0.5, 0.8) = -0.5, not counted (A > 0)        grad -0.5
    #  3 (1.5, +1): -min(1.5, 1.2) = -1.2, clipped high               grad 0
    #  4 (1.5, -1): max(1.5, 1.2) = 1.5 < 3, dual inactive            grad +1.5
    #  5 (5.0, -1): max(5, 1.2) = 5 > 3 -> dual: 3                    grad 0
    #  6 (1.0,  0): 0                                                 grad 0
    #  7 padding (rho 100, A -1) ignored
    rhos = [0.5, 0.5, 1.5, 1.5, 5.0, 1.0, 100.0]
    advs = [-1.0, 1.0, 1.0, -1.0, -1.0, 0.0, -1.0]
    logp = torch.tensor([[math.log(r) for r in rhos]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    loss, m = policy_loss(logp, torch.zeros_like(logp), torch.tensor([advs], dtype=torch.float64), mask, dual_clip=3.0)
    loss.backward()
    assert loss.item() == pytest.approx((0.8 - 0.5 - 1.2 + 1.5 + 3.0 + 0.0) / 6)
    assert logp.grad[0].tolist() == pytest.approx([0, -0.5 / 6, 0, 1.5 / 6, 0, 0, 0])
    assert m["clip_frac_low"] == pytest.approx(1 / 6)
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["dual_clip_frac"] == pytest.approx(1 / 6)
    assert m["ratio_mean"] == pytest.approx((0.5 + 0.5 + 1.5 + 1.5 + 5.0 + 1.0) / 6)
    assert m["ratio_min"] == pytest.approx(0.5) and m["ratio_max"] == pytest.approx(5.0)
    assert m["approx_kl"] == pytest.approx(-(2 * math.log(0.5) + 2 * math.log(1.5) + math.log(5.0)) / 6)
    assert m["objective_per_token"] == pytest.approx(-loss.item())
    # without dual clip token 5 costs 5 instead of 3
    loss2, m2 = policy_loss(logp.detach(), torch.zeros_like(logp), torch.tensor([advs], dtype=torch.float64), mask)
    assert loss2.item() == pytest.approx((0.8 - 0.5 - 1.2 + 1.5 + 5.0) / 6)
    assert m2["dual_clip_frac"] == 0.0


def test_dual_clip_never_touches_positive_advantage():
    loss, grad, m = one_token(10.0, 1.0, dual_clip=3.0)  # -min(10, 1.2) = -1.2
    assert loss == pytest.approx(-1.2) and m["dual_clip_frac"] == 0.0


def test_objective_views_per_token_and_per_response():
    # row 0: 3 tokens with loss -A*rho, rho 1, A = 1 -> objective 1 per token
    # row 1: 1 token, A = -2 -> objective -2
    # per token: (1 + 1 + 1 - 2) / 4 = 0.25; per response: (3/3 + (-2)/1) / 2 = -0.5
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, m = policy_loss(logp, logp, torch.tensor([1.0, -2.0]), mask, aggregation="seq-mean-token-sum")
    assert m["objective_per_token"] == pytest.approx(0.25)
    assert m["objective_per_response"] == pytest.approx(-0.5)
    # the optimised loss followed the requested mode: -(3 - 2) / 2
    assert loss.item() == pytest.approx(-0.5)


# ---------------------------------------------------------------- ratios


def test_log_ratio_levels_hand_case():
    # row 0 real log-ratios [ln 2, ln 8] -> log s = (ln 2 + ln 8) / 2 = ln 4; row 1 empty
    logp = torch.tensor([[math.log(2), math.log(8), 5.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    old = torch.zeros_like(logp)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    tok = log_ratio(logp, old, mask, level="token")
    seq = log_ratio(logp, old, mask, level="sequence")
    st = log_ratio(logp, old, mask, level="sequence-token")
    assert tok.flatten().tolist() == pytest.approx([math.log(2), math.log(8), 0.0, 0.0, 0.0, 0.0])
    assert seq.flatten().tolist() == pytest.approx([math.log(4), math.log(4), 0.0, 0.0, 0.0, 0.0])
    assert st.flatten().tolist() == pytest.approx(seq.flatten().tolist())


def test_log_ratio_clamped_at_20():
    logp = torch.tensor([[50.0, -50.0]], requires_grad=True)
    lr = log_ratio(logp, torch.zeros(1, 2), torch.ones(1, 2), level="token")
    assert lr.tolist() == [[20.0, -20.0]]
    lr.sum().backward()
    assert logp.grad.tolist() == [[0.0, 0.0]]  # clamped: no gradient
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), eps_high=1e9)
    assert torch.isfinite(loss)


def test_sequence_ratio_gradient_spreads_evenly():
    # d log s / d logp_t = 1/|o| for each real token
    logp = torch.tensor([[0.1, 0.3, 0.0, 0.0]], requires_grad=True)
    seq = log_ratio(logp, torch.zeros(1, 4), torch.tensor([[1, 1, 1, 0]]), level="sequence")
    seq[0, 0].backward()
    assert logp.grad.tolist()[0] == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])


def _batch(seed=0, B=4, T=6, off=0.3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logp = old + off * torch.randn(B, T, generator=g, dtype=dtype)
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [1, 1, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0],
        ]
    )[:B, :T].bool()
    # garbage at padding must never matter
    logp = torch.where(mask, logp, torch.full_like(logp, 60.0))
    old = torch.where(mask, old, torch.full_like(old, -float("inf")))
    adv_seq = torch.randn(B, generator=g, dtype=dtype)
    adv_tok = torch.randn(B, T, generator=g, dtype=dtype)
    entropy = torch.rand(B, T, generator=g, dtype=dtype)
    return logp, old, mask, adv_seq, adv_tok, entropy


def _loss_and_grad(logp, old, adv, mask, **kw):
    lp = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(lp, old, adv, mask, **kw)
    loss.backward()
    return loss.detach(), lp.grad, metrics


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_on_policy_all_ratio_levels_agree(aggregation):
    # logp == old_logp: every ratio is 1, so level and clipping change nothing (algorithms.md §2)
    logp, _, mask, adv, _, _ = _batch(1)
    old = logp.detach().clone()
    results = {
        r: _loss_and_grad(logp, old, adv, mask, ratio=r, aggregation=aggregation, horizon=8, group_size=2, **SEQ_EPS)
        for r in RATIOS
    }
    ref_loss, ref_grad, _ = results["token"]
    assert ref_grad.abs().sum() > 0
    for r, (loss, grad, m) in results.items():
        assert torch.allclose(loss, ref_loss, atol=1e-12), r
        assert torch.allclose(grad, ref_grad, atol=1e-12), r
        assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac_low"] == m["clip_frac_high"] == 0.0
    # entropy mixing: same on-policy loss value (its sequence branch redistributes the gradient)
    loss, _, _ = _loss_and_grad(
        logp,
        old,
        adv,
        mask,
        ratio="hybrid",
        mix="entropy",
        entropy=torch.rand(4, 6),
        aggregation=aggregation,
        horizon=8,
        group_size=2,
        **SEQ_EPS,
    )
    assert torch.allclose(loss, ref_loss, atol=1e-12)


def test_on_policy_sequence_token_equals_token_with_per_token_advantages():
    logp, _, mask, _, adv_tok, _ = _batch(2)
    old = logp.detach().clone()
    l1, g1, _ = _loss_and_grad(logp, old, adv_tok, mask, ratio="token")
    l2, g2, _ = _loss_and_grad(logp, old, adv_tok, mask, ratio="sequence-token")
    assert torch.allclose(l1, l2, atol=1e-12) and torch.allclose(g1, g2, atol=1e-12)


def test_off_policy_ratio_levels_differ():
    logp, old, mask, adv, _, _ = _batch(3, off=0.4)
    losses = {r: _loss_and_grad(logp, old, adv, mask, ratio=r, **SEQ_EPS)[0].item() for r in RATIOS}
    for a, b in itertools.combinations(["token", "sequence", "hybrid"], 2):
        assert abs(losses[a] - losses[b]) > 1e-4, (a, b, losses)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_sequence_token_equals_sequence_with_per_response_advantage(aggregation):
    # GSPO-token == GSPO when A is per response (arXiv 2507.18071 §4.3), value and gradient
    logp, old, mask, adv, _, _ = _batch(4, off=0.4)
    kw = dict(aggregation=aggregation, horizon=8, group_size=2, eps_low=0.03, eps_high=0.04)
    l1, g1, _ = _loss_and_grad(logp, old, adv, mask, ratio="sequence", **kw)
    l2, g2, _ = _loss_and_grad(logp, old, adv, mask, ratio="sequence-token", **kw)
    assert torch.allclose(l1, l2, atol=1e-12) and torch.allclose(g1, g2, atol=1e-12)


def test_gspo_honours_aggregation_mode():
    # ragged batch with unequal advantages: token-mean and seq-mean-token-mean must differ
    logp, old, mask, adv, _, _ = _batch(5, off=0.4)
    a, _, _ = _loss_and_grad(logp, old, adv, mask, ratio="sequence", aggregation="token-mean")
    b, _, _ = _loss_and_grad(logp, old, adv, mask, ratio="sequence", aggregation="seq-mean-token-mean")
    assert abs(a.item() - b.item()) > 1e-4


def test_hybrid_hand_case():
    # log r = [ln 1.5, ln(2/3)] -> log s = 0, s = 1; A = +1; token range [0.8, 1.28], seq [0.95, 1.08]
    # token branch: min(1.5, 1.28) = 1.28; min(2/3, 0.8) = 2/3. seq branch: 1, 1
    # mean mix: l = -[0.5*1.28 + 0.5], -[0.5*(2/3) + 0.5] -> token-mean = -(1.14 + 0.8333..)/2
    logp = torch.tensor([[math.log(1.5), math.log(2 / 3)]], dtype=torch.float64)
    old, mask, adv = torch.zeros_like(logp), torch.ones(1, 2), torch.tensor([1.0], dtype=torch.float64)
    kw = dict(ratio="hybrid", eps_low=0.2, eps_high=0.28, seq_eps_low=0.05, seq_eps_high=0.08)
    loss, m = policy_loss(logp, old, adv, mask, **kw)
    assert loss.item() == pytest.approx(-(1.14 + (0.5 * 2 / 3 + 0.5)) / 2)
    assert m["ratio_max"] == pytest.approx(1.5)  # token ratio reported
    assert m["seq_ratio_mean"] == pytest.approx(1.0)
    assert m["clip_frac_high"] == pytest.approx(0.5) and m["mix_weight_mean"] == pytest.approx(0.5)
    # entropy mix, w = [1, 0]: token 1 uses its own ratio, token 2 the sequence's -> -(1.28 + 1)/2
    loss, m = policy_loss(logp, old, adv, mask, mix="entropy", entropy=torch.tensor([[1.0, 0.0]]), **kw)
    assert loss.item() == pytest.approx(-(1.28 + 1.0) / 2)


# ---------------------------------------------------------------- independent loop implementation


def reference_policy_loss(
    logp,
    old,
    adv,
    mask,
    *,
    ratio,
    aggregation,
    eps_low,
    eps_high,
    dual_clip,
    seq_eps_low,
    seq_eps_high,
    horizon,
    entropy,
    group_size,
):
    """Straightforward per-token loop (torch scalars so autograd gives the gradient)."""
    B, T = mask.shape
    n_tokens = int(mask.sum())
    # ScaleRL's prompt-mean: each prompt's group of group_size rows weighs 1/n_prompts, split over its tokens
    group_tokens = [
        int(mask[(i // group_size) * group_size : (i // group_size + 1) * group_size].sum()) for i in range(B)
    ]
    total = logp.new_zeros(())

    def surrogate(rho, a, lo, hi):
        return torch.minimum(rho * a, torch.clamp(rho, 1 - lo, 1 + hi) * a)

    for i in range(B):
        idx = [t for t in range(T) if mask[i, t]]
        if not idx:
            continue
        log_s = sum(logp[i, t] - old[i, t] for t in idx) / len(idx)
        for t in idx:
            a = adv[i] if adv.dim() == 1 else adv[i, t]
            log_r = logp[i, t] - old[i, t]
            if ratio == "token":
                obj = surrogate(torch.exp(log_r), a, eps_low, eps_high)
            elif ratio == "sequence":
                obj = surrogate(torch.exp(log_s), a, eps_low, eps_high)
            elif ratio == "sequence-token":
                obj = surrogate(torch.exp(logp[i, t] - logp[i, t].detach() + log_s.detach()), a, eps_low, eps_high)
            else:
                w = 0.5 if entropy is None else entropy[i, t]
                obj = w * surrogate(torch.exp(log_r), a, eps_low, eps_high) + (1 - w) * surrogate(
                    torch.exp(log_s), a, seq_eps_low, seq_eps_high
                )
            ell = -obj
            if dual_clip is not None and a < 0:
                ell = torch.minimum(ell, -dual_clip * a)
            weight = {
                "token-mean": 1 / n_tokens,
                "token-sum": 1.0,
                "seq-mean-token-mean": 1 / (B * len(idx)),
                "seq-mean-token-sum": 1 / B,
                "seq-mean-token-sum-norm": 1 / (B * horizon),
                "prompt-mean-token-mean": 1 / ((B / group_size) * group_tokens[i]),
            }[aggregation]
            total = total + weight * ell
    return total


@pytest.mark.parametrize("ratio", RATIOS + ["hybrid-entropy"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_policy_loss_matches_reference_loop(ratio, aggregation):
    logp, old, mask, adv_seq, adv_tok, entropy = _batch(6, B=6, off=0.35)
    ent = entropy if ratio == "hybrid-entropy" else None
    r = "hybrid" if ratio == "hybrid-entropy" else ratio
    # sequence ratios move less than token ratios: tighter ranges so that clipping happens
    eps = (0.2, 0.28) if r in ("token", "hybrid") else (0.05, 0.08)
    seen = {"clip": 0.0, "dual": 0.0}
    for adv, dual in itertools.product([adv_seq, adv_tok], [None, 1.5, 1.05]):
        kw = dict(
            aggregation=aggregation,
            eps_low=eps[0],
            eps_high=eps[1],
            dual_clip=dual,
            horizon=9,
            seq_eps_low=0.02,
            seq_eps_high=0.03,
            group_size=2,
        )
        extra = dict(mix="entropy", entropy=ent) if ent is not None else {}
        loss, grad, m = _loss_and_grad(logp, old, adv, mask, ratio=r, **kw, **extra)
        lp = logp.clone().requires_grad_(True)
        ref = reference_policy_loss(lp, old, adv, mask, ratio=r, entropy=ent, **kw)
        ref.backward()
        assert loss.item() == pytest.approx(ref.item(), abs=1e-5)
        assert torch.allclose(grad, lp.grad, atol=1e-5)
        assert torch.isfinite(grad).all() and (grad[~mask] == 0).all()
        seen["clip"] += (
            m["clip_frac_low"] + m["clip_frac_high"] + m.get("seq_clip_frac_low", 0) + m.get("seq_clip_frac_high", 0)
        )
        seen["dual"] += m["dual_clip_frac"]
    # the random case really exercises both clips, not just the unclipped branch
    assert seen["clip"] > 0 and seen["dual"] > 0


# ---------------------------------------------------------------- aggregation


def _ragged():
    # real losses: row 0 [1, 2, 3], row 1 [4], row 2 empty, row 3 [5, 6]; 99 = padding
    loss = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0], [99.0] * 4, [5.0, 6.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    return loss, mask


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 21 / 6),  # (1+2+3+4+5+6) / 6 tokens
        ("token-sum", 21.0),
        ("seq-mean-token-mean", (6 / 3 + 4 / 1 + 0 + 11 / 2) / 4),  # = 2.875; empty row counts in B = 4
        ("seq-mean-token-sum", (6 + 4 + 0 + 11) / 4),  # = 5.25
        ("seq-mean-token-sum-norm", 21 / (4 * 8)),  # H = 8 -> 0.65625
    ],
)
def test_aggregate_hand_computed(mode, expected):
    loss, mask = _ragged()
    assert aggregate(loss, mask, mode, horizon=8).item() == pytest.approx(expected)
    assert aggregate(loss, mask.bool(), mode, horizon=8).item() == pytest.approx(expected)
    w = aggregation_weights(mask, mode, horizon=8)
    assert (w * torch.where(mask.bool(), loss, 0)).sum().item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_micro_batch_invariance(mode):
    g = torch.Generator().manual_seed(7)
    loss = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0]]
    )
    full = aggregate(loss, mask, mode, horizon=7, group_size=3)
    totals = dict(horizon=7, total_tokens=int(mask.sum()), total_seqs=6, group_size=3)
    # groups of 3 rows hold 5+2+0 and 1+3+3 real tokens; the second split cuts the first group
    group_tokens = torch.tensor([7, 7, 7, 7, 7, 7])
    for splits in ([slice(0, 3), slice(3, 6)], [slice(0, 2), slice(2, 3), slice(3, 6)]):
        parts = sum(aggregate(loss[s], mask[s], mode, group_tokens=group_tokens[s], **totals) for s in splits)
        assert parts.item() == pytest.approx(full.item(), abs=1e-12)
    whole_groups = sum(aggregate(loss[s], mask[s], mode, **totals) for s in (slice(0, 3), slice(3, 6)))
    assert whole_groups.item() == pytest.approx(full.item(), abs=1e-12)


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_policy_loss_micro_batch_invariance(ratio, aggregation):
    logp, old, mask, adv, _, _ = _batch(8, B=6, off=0.4)
    kw = dict(ratio=ratio, aggregation=aggregation, horizon=9, dual_clip=2.0, group_size=1, **SEQ_EPS)
    full, g_full, _ = _loss_and_grad(logp, old, adv, mask, **kw)
    totals = dict(total_tokens=int(mask.sum()), total_seqs=6)
    parts, grads = 0.0, []
    for s in (slice(0, 2), slice(2, 3), slice(3, 6)):
        l, g, _ = _loss_and_grad(logp[s], old[s], adv[s], mask[s], **kw, **totals)
        parts += l.item()
        grads.append(g)
    assert parts == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(torch.cat(grads), g_full, atol=1e-12)


def test_aggregate_empty_is_zero_not_nan():
    loss = torch.randn(3, 4, requires_grad=True)
    for mode in AGGREGATIONS:
        out = aggregate(loss, torch.zeros(3, 4), mode, horizon=4, group_size=3)
        assert out.item() == 0.0
        out = aggregate(loss[:0], torch.zeros(0, 4), mode, horizon=4, group_size=3)
        assert out.item() == 0.0
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, m = policy_loss(lp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), ratio="sequence")
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(2, 3))
    assert all(math.isfinite(v) for v in m.values())


def test_aggregate_errors():
    loss, mask = _ragged()
    with pytest.raises(ValueError, match=r"horizon must be > 0 .*pass horizon=max_new_tokens"):
        aggregate(loss, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"horizon must be > 0"):
        aggregate(loss, mask, "seq-mean-token-sum-norm", horizon=0)
    with pytest.raises(ValueError, match=r"aggregation mode must be one of 'token-mean', .*got 'mean'"):
        aggregate(loss, mask, "mean")
    with pytest.raises(ValueError, match=r"total_tokens must be >= 0"):
        aggregate(loss, mask, "token-mean", total_tokens=-1)
    with pytest.raises(ValueError, match=r"mask must have shape"):
        aggregate(loss, mask[:, :2], "token-mean")


# ---------------------------------------------------------------- validation of policy_loss


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(ratio="seq"), r"ratio must be one of 'token', 'sequence', 'sequence-token', 'hybrid', got 'seq'"),
        (dict(aggregation="sum"), r"aggregation must be one of 'token-mean'.*got 'sum'"),
        (dict(eps_low=-0.1), r"eps_low must be a number >= 0"),
        (dict(eps_high=-0.1), r"eps_high must be a number >= 0"),
        (dict(dual_clip=1.0), r"dual_clip must be > 1 \(or None to disable\)"),
        (dict(ratio="hybrid"), r"ratio='hybrid' needs seq_eps_low and seq_eps_high"),
        (dict(ratio="hybrid", mix="entropy", **SEQ_EPS), r"mix='entropy' needs entropy"),
        (dict(mix="max"), r"algorithm\.clip\.mix='max' must be one of mean, entropy; set algorithm\.clip\.mix=mean"),
        (dict(aggregation="seq-mean-token-sum-norm"), r"horizon must be > 0"),
    ],
)
def test_policy_loss_bad_settings(kw, match):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, torch.ones(2), torch.ones(2, 3), **kw)


def test_policy_loss_bad_shapes():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"advantages must be \[B\] or \[B, T\]"):
        policy_loss(x, x, torch.ones(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask must have shape"):
        policy_loss(x, x, torch.ones(2), torch.ones(2, 4))


# ---------------------------------------------------------------- KL


def test_kl_estimators_formulas():
    # x = ref - logp = -2 - (-1) = -1: k1 = 1, k2 = 0.5, k3 = e^-1 + 1 - 1 = e^-1
    logp, ref = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-2.0, -0.5]])
    assert kl_divergence(logp, ref, estimator="k1").tolist()[0] == pytest.approx([1.0, 0.0])
    assert kl_divergence(logp, ref, estimator="k2").tolist()[0] == pytest.approx([0.5, 0.0])
    assert kl_divergence(logp, ref, estimator="k3").tolist()[0] == pytest.approx([math.exp(-1), 0.0])
    # x = +2: k3 = e^2 - 3
    assert kl_divergence(torch.tensor([0.0]), torch.tensor([2.0])).item() == pytest.approx(math.exp(2) - 3, rel=1e-6)


def test_k3_nonnegative_and_clamped():
    g = torch.Generator().manual_seed(9)
    logp, ref = torch.randn(50, 20, generator=g) * 3, torch.randn(50, 20, generator=g) * 3
    assert (kl_divergence(logp, ref, estimator="k3") >= 0).all()
    # verl's low_var_kl (core_algos.kl_penalty_forward): x = ref - logp clamped to +-20, the k3 value to
    # [-10, 10]. x = 2: e^2 - 3 = 4.389 (inside); x = 3: e^3 - 4 = 16.09 -> 10; x = 50 -> 10; x = -50 -> -20:
    # e^-20 + 20 - 1 = 19.0 -> 10
    vals = kl_divergence(torch.zeros(4), torch.tensor([2.0, 3.0, 50.0, -50.0]), estimator="k3")
    assert vals.tolist() == pytest.approx([math.exp(2) - 3, 10.0, 10.0, 10.0], rel=1e-6)
    logp = torch.zeros(2, requires_grad=True)
    kl_divergence(logp, torch.tensor([2.0, 3.0]), estimator="k3").sum().backward()
    assert logp.grad.tolist() == pytest.approx([1 - math.exp(2), 0.0], rel=1e-6)  # a clamped value: no gradient


def test_kl_gradient_and_mask():
    logp = torch.tensor([[-1.0, 3.0]], requires_grad=True)
    kl = kl_divergence(logp, torch.tensor([[-2.0, 0.0]]), estimator="k3", mask=torch.tensor([[1, 0]]))
    assert kl[0, 1].item() == 0.0
    kl.sum().backward()
    # d/dlogp [e^x - x - 1] with x = ref - logp: -(e^x - 1) = 1 - e^-1
    assert logp.grad.tolist()[0] == pytest.approx([1 - math.exp(-1), 0.0])
    with pytest.raises(ValueError, match=r"estimator must be one of 'k1', 'k2', 'k3', 'k3\+', got 'k4'"):
        kl_divergence(logp, logp, estimator="k4")


# ---------------------------------------------------------------- value loss


def test_value_loss_hand_case():
    # token 1: V 1.5, V_old 1.0, R 2.0, c 0.2: clip(V) = 1.2; (1.5-2)^2 = 0.25, (1.2-2)^2 = 0.64 -> 0.32 (clipped)
    # token 2: V 0.9, V_old 1.0, R 0.0: inside range, 0.81 -> 0.405
    values = torch.tensor([[1.5, 0.9, 7.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.0]])
    ret = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = value_loss(values, old, ret, mask, clip=0.2)
    assert loss.item() == pytest.approx((0.32 + 0.405) / 2)
    assert m["value_clip_frac"] == pytest.approx(0.5)
    assert m["value_mean"] == pytest.approx(1.2) and m["return_mean"] == pytest.approx(1.0)
    loss.backward()
    # clipped token: no gradient; other: (V - R) / 2 tokens = 0.45
    assert values.grad.tolist()[0] == pytest.approx([0.0, 0.45, 0.0])
    loss, m = value_loss(values, old, ret, mask, clip=None)
    assert loss.item() == pytest.approx((0.125 + 0.405) / 2) and m["value_clip_frac"] == 0.0
    loss, _ = value_loss(values, old, ret, mask, clip=0.2, aggregation="token-sum")
    assert loss.item() == pytest.approx(0.32 + 0.405)
    loss, _ = value_loss(values[:, :2], old[:, :2], ret[:, :2], mask[:, :2], aggregation="token-mean", total_tokens=4)
    assert loss.item() == pytest.approx((0.32 + 0.405) / 4)
    with pytest.raises(ValueError, match=r"clip must be >= 0 \(or None"):
        value_loss(values, old, ret, mask, clip=-1)


# ---------------------------------------------------------------- overlong penalty (DAPO Eq. 13)


def test_overlong_penalty_boundaries():
    # L_max 20, L_cache 4 -> free up to 16, linear to -1 at 20, -1 beyond
    out = overlong_penalty(torch.tensor([0, 16, 17, 18, 20, 21]), max_len=20, cache_len=4)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    half = overlong_penalty(torch.tensor([18, 25]), max_len=20, cache_len=4, factor=0.5)
    assert half.tolist() == pytest.approx([-0.25, -0.5])
    with pytest.raises(ValueError, match=r"cache_len must be in \(0, max_len=20\]"):
        overlong_penalty(torch.tensor([1]), max_len=20, cache_len=0)
    with pytest.raises(ValueError, match=r"max_len must be > 0"):
        overlong_penalty(torch.tensor([1]), max_len=0, cache_len=0)


# ---------------------------------------------------------------- entropy


def test_entropy_from_logits():
    V = 7
    assert entropy_from_logits(torch.zeros(2, 3, V)).flatten().tolist() == pytest.approx([math.log(V)] * 6)
    # p = [0.5, 0.25, 0.25] via logits log p: H = 1.5 ln 2
    h = entropy_from_logits(torch.log(torch.tensor([[0.5, 0.25, 0.25]])))
    assert h.item() == pytest.approx(1.5 * math.log(2), rel=1e-6)
    # huge logits and filtered (-inf) entries stay finite
    extreme = torch.tensor([[1e4, 0.0, -float("inf")], [0.0, 0.0, -float("inf")]])
    h = entropy_from_logits(extreme)
    assert torch.isfinite(h).all() and h.tolist() == pytest.approx([0.0, math.log(2)], abs=1e-6)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, 11, generator=g)
    p = torch.softmax(z, -1)
    direct = -(p * p.log()).sum(-1)
    assert torch.allclose(entropy_from_logits(z), direct, atol=1e-5)
    assert torch.allclose(entropy_from_logits(z, chunk_size=4), entropy_from_logits(z), atol=1e-6)
