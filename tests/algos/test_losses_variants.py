"""The variants of 2025-26 in rlcompare.algos.losses (issue 19), against the worked numbers of docs/algorithms.md §7
(the shared variants.md: example E and the per-section examples), the limits where a variant reduces to another,
micro-batch invariance, and an independent per-token re-implementation on random padded batches."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlcompare.algos.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    MISMATCH_MODES,
    SURROGATE_METRICS,
    SURROGATES,
    aggregate,
    entropy_mask,
    entropy_threshold,
    group_token_counts,
    kl_divergence,
    mismatch_weights,
    token_covariance,
)
from tests.algos.loss_kwargs import cov_selection, policy_loss

F64 = torch.float64


# ---------------------------------------------------------------- shared worked example E (variants.md)
# B = 2, T = 3, all real, old_logp = -1, r = [[1.5, 1, 0.5], [0.7, 1.25, 2]], A = [+1, -0.5]


def example_e():
    r = torch.tensor([[1.5, 1.0, 0.5], [0.7, 1.25, 2.0]], dtype=F64)
    old = torch.full((2, 3), -1.0, dtype=F64)
    return old + r.log(), old, torch.tensor([1.0, -0.5], dtype=F64), torch.ones(2, 3, dtype=torch.bool)


def loss_grad(logp, old, adv, mask, **kw):
    lp = logp.detach().clone().requires_grad_(True)
    loss, metrics = policy_loss(lp, old, adv, mask, **kw)
    loss.backward()
    return loss.item(), lp.grad, metrics


E_CASES = {
    # name: (policy_loss kwargs, L, gradient) -- variants.md §1-4, §10
    "ppo": (dict(), -0.1125, [[0, -1 / 6, -1 / 12], [0, 0.104167, 0.166667]]),
    "cispo_minimax_verl_example": (
        dict(surrogate="cispo", cispo_w_min=None, cispo_w_max=1.2),
        0.239159,
        [[-0.2, -0.166667, -0.083333], [0.058333, 0.1, 0.1]],
    ),
    "cispo_verl_defaults": (
        dict(surrogate="cispo", cispo_w_min=0.8, cispo_w_max=1.2),
        0.312511,
        [[-0.2, -0.166667, -0.133333], [0.066667, 0.1, 0.1]],
    ),
    "cispo_trl_scalerl": (
        dict(surrogate="cispo"),  # defaults: w_min None, w_max 5
        0.245192,
        [[-0.25, -0.166667, -0.083333], [0.058333, 0.104167, 0.166667]],
    ),
    "cispo_trl_epsilon_high_unset": (
        dict(surrogate="cispo", cispo_w_max=0.2),
        0.068916,
        [[-0.033333] * 3, [0.016667] * 3],
    ),
    "sapo": (
        dict(surrogate="sapo", aggregation="seq-mean-token-mean"),
        -0.451454,
        [[-0.235004, -0.166667, -0.078335], [0.056910, 0.102393, 0.128018]],
    ),
    "gmpo": (
        dict(surrogate="gmpo", aggregation="seq-mean-token-mean"),
        -0.152186,
        [[0, -0.151151, -0.151151], [0.100423, 0.100423, 0.100423]],
    ),
    "dppo_tv": (
        dict(surrogate="dppo-tv"),  # delta 0.15 / 0.15, C 20
        0.096558,
        [[0, -0.166667, -0.083333], [0.058333, 0.104167, 0.166667]],
    ),
    "dppo_kl": (
        dict(surrogate="dppo-kl", dppo_delta_low=0.05, dppo_delta_high=0.05),
        0.096558,
        [[0, -0.166667, -0.083333], [0.058333, 0.104167, 0.166667]],
    ),
    "kl_cov_beta_1": (
        dict(surrogate="kl-cov", cov_ratio=2e-4, kl_cov_coef=1.0),  # k = max(1, int(0.0012)) = 1 -> token (1, 0)
        -0.111388,
        [[-0.25, -0.166667, -0.083333], [-0.108333, 0.104167, 0.166667]],
    ),
    "kl_cov_verl_beta": (
        dict(surrogate="kl-cov", cov_ratio=2e-4, kl_cov_coef=0.1),
        -0.164889,
        [[-0.25, -0.166667, -0.083333], [0.041667, 0.104167, 0.166667]],
    ),
    "clip_cov_verl_defaults": (
        dict(surrogate="clip-cov"),  # no Cov in (1, 5): exactly PPO
        -0.1125,
        [[0, -1 / 6, -1 / 12], [0, 0.104167, 0.166667]],
    ),
    "clip_cov_authors": (
        dict(surrogate="clip-cov", eps_low=1.0, eps_high=1.0, cov_lb=0.28, cov_ub=5.0),  # removes (1, 0)
        -0.229167,
        [[-0.25, -0.166667, -0.083333], [0, 0.104167, 0.166667]],
    ),
}


@pytest.mark.parametrize("case", sorted(E_CASES))
def test_worked_example_e(case):
    kw, want_loss, want_grad = E_CASES[case]
    loss, grad, _ = loss_grad(*example_e(), **kw)
    assert loss == pytest.approx(want_loss, abs=1e-6)
    assert grad.tolist() == [pytest.approx(row, abs=1e-6) for row in want_grad]


def test_example_e_covariance_and_what_each_variant_reports():
    logp, old, adv, mask = example_e()
    # mean A = 0.25, mean logp = -0.954678 (variants.md §4)
    cov = token_covariance(logp, adv, mask)
    want = [[0.270107, -0.033992, -0.553852], [0.301498, -0.133366, -0.485869]]
    assert cov.tolist() == [pytest.approx(row, abs=1e-6) for row in want]
    # CISPO w_max 1.2 caps r = 1.5, 1.25, 2.0 (3 of 6); the weights [[1.2, 1, 0.5], [0.7, 1.2, 1.2]] average 0.966667
    _, _, m = loss_grad(logp, old, adv, mask, surrogate="cispo", cispo_w_max=1.2)
    assert m["is_clip_frac_high"] == pytest.approx(0.5) and m["is_clip_frac_low"] == 0.0
    assert m["is_weight_mean"] == pytest.approx(5.8 / 6)
    # SAPO's gradient weights w = [[0.940015, 1, 0.940015], [0.975598, 0.982969, 0.768110]]
    _, _, m = loss_grad(logp, old, adv, mask, surrogate="sapo")
    assert m["sapo_weight_mean"] == pytest.approx(5.606707 / 6, abs=1e-6)
    # GMPO clips token (0, 0) only; R = [0.906907, 1.205071]
    _, _, m = loss_grad(logp, old, adv, mask, surrogate="gmpo")
    assert m["gmpo_clip_frac"] == pytest.approx(1 / 6) and m["gmpo_ratio_mean"] == pytest.approx(
        (0.906907 + 1.205071) / 2, abs=1e-6
    )
    # DPPO masks (0, 0); KL-Cov and Clip-Cov (authors) select one token
    assert loss_grad(logp, old, adv, mask, surrogate="dppo-tv")[2]["dppo_mask_frac"] == pytest.approx(1 / 6)
    assert loss_grad(logp, old, adv, mask, surrogate="kl-cov", cov_ratio=2e-4)[2]["cov_selected_frac"] == pytest.approx(
        1 / 6
    )
    assert loss_grad(logp, old, adv, mask, surrogate="clip-cov")[2]["cov_selected_frac"] == 0.0


@pytest.mark.parametrize("surrogate", SURROGATES)
def test_every_surrogate_returns_the_common_metrics_plus_its_own(surrogate):
    _, _, m_clip = loss_grad(*example_e())
    _, _, m = loss_grad(*example_e(), surrogate=surrogate)
    # clip declares DHPO's sequence-branch metrics, reported with ratio=hybrid only (checked below)
    own = set(SURROGATE_METRICS[surrogate]) - (set(SURROGATE_METRICS["clip"]) if surrogate == "clip" else set())
    assert set(m) == set(m_clip) | own
    if surrogate == "clip":
        _, _, hybrid = loss_grad(*example_e(), ratio="hybrid", seq_eps_low=3e-4, seq_eps_high=4e-4)
        assert set(hybrid) == set(m_clip) | set(SURROGATE_METRICS["clip"])
    # PPO's region is reported for every surrogate (so that they compare): r = 1.5 with A > 0, r = 0.7 with A < 0
    assert m["clip_frac_high"] == pytest.approx(1 / 6) and m["clip_frac_low"] == pytest.approx(1 / 6)
    assert m["ratio_max"] == pytest.approx(2.0) and m["ratio_min"] == pytest.approx(0.5)


# ---------------------------------------------------------------- limits (variants.md "Limits")


def random_batch(seed, B=6, T=7, off=0.35, G=2):
    """Old log-probs in [-3, 0), the policy off by N(0, off) (kept < 0); ragged real tokens, garbage at padding."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.01
    logp = (old + off * torch.randn(B, T, generator=g, dtype=F64)).clamp(max=-0.01)  # log-probs stay < 0
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T  # at least one full row
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    mask[1, 0] = False  # a hole: real tokens need not start at 0 (prompt-side masking)
    logp = torch.where(mask, logp, torch.full_like(logp, 60.0))
    old = torch.where(mask, old, torch.full_like(old, -float("inf")))
    adv_seq = torch.randn(B, generator=g, dtype=F64)
    adv_tok = torch.randn(B, T, generator=g, dtype=F64)
    return logp, old, mask, adv_seq, adv_tok


AGG_KW = dict(horizon=9, group_size=2)
ON_POLICY_EQUALS_GRPO = ["cispo", "sapo", "gmpo", "dppo-tv", "dppo-kl", "kl-cov"]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("surrogate", ON_POLICY_EQUALS_GRPO)
def test_on_policy_gradient_equals_grpo(surrogate, aggregation):
    # r = 1: CISPO's w = 1, SAPO's gate weight 1, GMPO's R = 1 (gradient A / |o_i| per token, spread evenly),
    # DPPO's p = mu (nothing masked), KL-Cov's |log r| = 0 -- each gives GRPO's -A grad logp
    logp, _, mask, adv_seq, _ = random_batch(1)
    old = torch.where(mask, logp, torch.zeros_like(logp))
    _, g_grpo, _ = loss_grad(logp, old, adv_seq, mask, aggregation=aggregation, **AGG_KW)
    _, g, _ = loss_grad(logp, old, adv_seq, mask, surrogate=surrogate, aggregation=aggregation, **AGG_KW)
    assert g_grpo.abs().sum() > 0
    torch.testing.assert_close(g, g_grpo, atol=1e-12, rtol=0)


def test_cispo_without_cap_is_the_unclipped_surrogate_gradient():
    logp, old, mask, _, adv_tok = random_batch(2)
    inf = float("inf")
    _, g_unclipped, m = loss_grad(logp, old, adv_tok, mask, eps_low=inf, eps_high=inf)
    _, g, _ = loss_grad(logp, old, adv_tok, mask, surrogate="cispo", cispo_w_min=None, cispo_w_max=None)
    assert m["ratio_max"] > 1.2 and m["ratio_min"] < 0.8  # really off-policy
    torch.testing.assert_close(g, g_unclipped, atol=1e-12, rtol=0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gmpo_with_infinite_range_is_unclipped_gspo(aggregation):
    logp, old, mask, adv_seq, _ = random_batch(3)
    inf = float("inf")
    l_gspo, g_gspo, _ = loss_grad(
        logp, old, adv_seq, mask, ratio="sequence", eps_low=inf, eps_high=inf, aggregation=aggregation, **AGG_KW
    )
    l, g, _ = loss_grad(
        logp,
        old,
        adv_seq,
        mask,
        surrogate="gmpo",
        gmpo_eps_low=inf,
        gmpo_eps_high=inf,
        aggregation=aggregation,
        **AGG_KW,
    )
    assert l == pytest.approx(l_gspo, abs=1e-12)
    torch.testing.assert_close(g, g_gspo, atol=1e-12, rtol=0)
    # with GMPO's own range (0.4) something is clipped on this batch, and the gradient moves
    _, g_clipped, m = loss_grad(
        logp,
        old,
        adv_seq,
        mask,
        surrogate="gmpo",
        aggregation=aggregation,
        gmpo_eps_low=0.1,
        gmpo_eps_high=0.1,
        **AGG_KW,
    )
    assert m["gmpo_clip_frac"] > 0 and not torch.allclose(g_clipped, g_gspo)


def test_sapo_small_temperature_tends_to_the_unclipped_surrogate():
    # tau -> 0: f(r) ~ 2/tau + (r - 1), gradient r A (vanilla IS-PG)
    logp, old, mask, _, adv_tok = random_batch(4)
    inf = float("inf")
    _, g_unclipped, _ = loss_grad(logp, old, adv_tok, mask, eps_low=inf, eps_high=inf)
    _, g, _ = loss_grad(logp, old, adv_tok, mask, surrogate="sapo", sapo_tau_pos=1e-4, sapo_tau_neg=1e-4)
    torch.testing.assert_close(g, g_unclipped, atol=1e-4, rtol=0)


def test_dppo_with_infinite_trust_region_is_cispo_capped_at_c():
    logp, old, mask, _, adv_tok = random_batch(5, off=1.5)  # some r above the cap 3
    inf = float("inf")
    kw = dict(dppo_delta_low=inf, dppo_delta_high=inf, dppo_cap=3.0)
    l, g, m = loss_grad(logp, old, adv_tok, mask, surrogate="dppo-tv", **kw)
    l_c, g_c, _ = loss_grad(logp, old, adv_tok, mask, surrogate="cispo", cispo_w_min=None, cispo_w_max=3.0)
    assert m["dppo_mask_frac"] == 0.0 and m["is_clip_frac_high"] > 0
    assert l == pytest.approx(l_c, abs=1e-12)
    torch.testing.assert_close(g, g_c, atol=1e-12, rtol=0)
    l_kl, g_kl, _ = loss_grad(logp, old, adv_tok, mask, surrogate="dppo-kl", **kw)
    assert l_kl == pytest.approx(l_c, abs=1e-12)
    torch.testing.assert_close(g_kl, g_c, atol=1e-12, rtol=0)


def test_kl_cov_with_zero_coefficient_is_the_unclipped_surrogate():
    logp, old, mask, _, adv_tok = random_batch(6)
    inf = float("inf")
    l_u, g_u, _ = loss_grad(logp, old, adv_tok, mask, eps_low=inf, eps_high=inf)
    l, g, m = loss_grad(logp, old, adv_tok, mask, surrogate="kl-cov", kl_cov_coef=0.0, cov_ratio=0.5)
    assert m["cov_selected_frac"] > 0
    assert l == pytest.approx(l_u, abs=1e-12)
    torch.testing.assert_close(g, g_u, atol=1e-12, rtol=0)


def test_clip_cov_without_candidates_is_ppo():
    logp, old, mask, adv_seq, _ = random_batch(7)
    l_ppo, g_ppo, _ = loss_grad(logp, old, adv_seq, mask)
    l, g, m = loss_grad(logp, old, adv_seq, mask, surrogate="clip-cov", cov_lb=100.0, cov_ub=200.0)
    assert m["cov_selected_frac"] == 0.0 and l == pytest.approx(l_ppo, abs=1e-12)
    torch.testing.assert_close(g, g_ppo, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- Clip-Cov / KL-Cov selection


def test_cov_selection_counts_and_draws():
    logp, old, mask, adv_seq, _ = random_batch(8, B=8, T=9)
    n_real = int(mask.sum())
    # KL-Cov: the k = max(1, int(ratio N)) largest covariances
    cov = token_covariance(logp, adv_seq, mask)
    sel = cov_selection(logp, old, adv_seq, mask, surrogate="kl-cov", cov_ratio=0.1)
    k = max(1, int(0.1 * n_real))
    assert int(sel.sum()) == k
    assert cov[sel].min() >= cov[mask & ~sel].max()
    # Clip-Cov: draws among unclipped tokens with lb < Cov < ub, at most max(1, int(ratio N)); seeded
    kw = dict(surrogate="clip-cov", cov_ratio=0.05, cov_lb=0.0, cov_ub=5.0)
    a = cov_selection(logp, old, adv_seq, mask, generator=torch.Generator().manual_seed(0), **kw)
    b = cov_selection(logp, old, adv_seq, mask, generator=torch.Generator().manual_seed(0), **kw)
    c = cov_selection(logp, old, adv_seq, mask, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(a, b) and int(a.sum()) == max(1, int(0.05 * n_real))
    candidates = mask & (cov > 0.0) & (cov < 5.0)
    assert not (a & ~candidates).any() and not torch.equal(a, c)
    # a ratio covering every candidate removes all of them (deterministic)
    everything = cov_selection(
        logp, old, adv_seq, mask, surrogate="clip-cov", cov_ratio=1.0, cov_lb=0.0, eps_low=10.0, eps_high=10.0
    )
    assert torch.equal(everything, candidates)


# ---------------------------------------------------------------- rollout/trainer mismatch (variants.md §8)
# PPO on E, token-mean, rho = [[1.2, 0.5, 6.0], [1.0, 2.5, 0.9]] (products 3.6 and 2.25)

MISMATCH_CASES = [
    (
        "token-truncate",
        dict(c_max=3.0),
        [[1.2, 0.5, 3], [1, 2.5, 0.9]],
        -0.09625,
        [[0, -0.083333, -0.25], [0, 0.260417, 0.15]],
    ),
    ("token-mask", dict(c_max=3.0), [[1.2, 0.5, 0], [1, 2.5, 0.9]], 0.15375, [[0, -0.083333, 0], [0, 0.260417, 0.15]]),
    ("sequence-truncate", dict(c_max=3.0), [[3] * 3, [2.25] * 3], -0.590625, [[0, -0.5, -0.25], [0, 0.234375, 0.375]]),
    ("sequence-mask", dict(c_max=3.0), [[0] * 3, [2.25] * 3], 0.759375, [[0, 0, 0], [0, 0.234375, 0.375]]),
    ("icepop", dict(), [[1.2, 0.5, 0], [1, 2.5, 0.9]], 0.15375, [[0, -0.083333, 0], [0, 0.260417, 0.15]]),
    ("token-truncate", dict(), [[1.2, 0.5, 2], [1, 2, 0.9]], -0.065, [[0, -0.083333, -0.166667], [0, 0.208333, 0.15]]),
    (
        "token-truncate",
        dict(c_min=0.5, c_max=5.0),
        [[1.2, 0.5, 5], [1, 2.5, 0.9]],
        -0.262917,
        [[0, -0.083333, -0.416667], [0, 0.260417, 0.15]],
    ),
]


@pytest.mark.parametrize("mode,kw,weights,want_loss,want_grad", MISMATCH_CASES)
def test_mismatch_worked_example(mode, kw, weights, want_loss, want_grad):
    logp, old, adv, mask = example_e()
    rho = torch.tensor([[1.2, 0.5, 6.0], [1.0, 2.5, 0.9]], dtype=F64)
    sampler = old - rho.log()
    w, _ = mismatch_weights(old, sampler, mask, mode=mode, **kw)
    assert w.tolist() == [pytest.approx(row, abs=1e-9) for row in weights]
    loss, grad, m = loss_grad(logp, old, adv, mask, token_weight=w)
    assert loss == pytest.approx(want_loss, abs=1e-6)
    assert grad.tolist() == [pytest.approx(row, abs=1e-6) for row in want_grad]
    assert m["token_weight_mean"] == pytest.approx(sum(map(sum, weights)) / 6)


def test_mismatch_metrics_hand_counted():
    _, old, _, mask = example_e()
    rho = torch.tensor([[1.2, 0.5, 6.0], [1.0, 2.5, 0.9]], dtype=F64)
    sampler = old - rho.log()
    gaps = [abs(math.log(x)) for x in (1.2, 0.5, 6.0, 1.0, 2.5, 0.9)]
    _, m = mismatch_weights(old, sampler, mask, mode="token-truncate", c_max=3.0)
    assert m["mismatch_truncated_frac"] == pytest.approx(1 / 6) and m["mismatch_masked_frac"] == 0.0
    assert m["mismatch_weight_mean"] == pytest.approx(9.1 / 6)
    assert m["mismatch_logp_gap_mean"] == pytest.approx(sum(gaps) / 6) and m["mismatch_logp_gap_max"] == pytest.approx(
        math.log(6)
    )
    _, m = mismatch_weights(old, sampler, mask, mode="sequence-mask", c_max=3.0)
    assert m["mismatch_masked_frac"] == pytest.approx(0.5) and m["mismatch_weight_mean"] == pytest.approx(6.75 / 6)


@pytest.mark.parametrize("mode", MISMATCH_MODES)
def test_mismatch_same_engine_is_the_identity(mode):
    logp, old, mask, _, _ = random_batch(9)
    w, m = mismatch_weights(old, old.clone(), mask, mode=mode)
    assert torch.equal(w, mask.to(F64)) and m["mismatch_logp_gap_max"] == 0.0


def test_mismatch_huge_sequence_product_is_masked_not_nan():
    old = torch.zeros(2, 40, dtype=F64)
    sampler = torch.full((2, 40), -30.0, dtype=F64)  # log prod = 1200: exp overflows
    mask = torch.ones(2, 40, dtype=torch.bool)
    w, _ = mismatch_weights(old, sampler, mask, mode="sequence-mask")
    assert torch.equal(w, torch.zeros_like(w))
    w, _ = mismatch_weights(old, sampler, mask, mode="sequence-truncate", c_max=2.0)
    assert torch.equal(w, torch.full_like(w, 2.0))


# ---------------------------------------------------------------- top-entropy mask (variants.md §7)


def test_entropy_mask_worked_example():
    logp, old, adv, mask = example_e()
    H = torch.tensor([[0.1, 2.0, 0.5], [1.5, 0.05, 3.0]], dtype=F64)
    # rho 0.2: thr = quantile(H, 0.8) = sorted[4.0] = 2.0 -> keep (0, 1), (1, 2); L = (-1 + 1) / 6 = 0
    keep = entropy_mask(H, mask, quantile=0.2)
    assert entropy_threshold(H, mask, quantile=0.2).item() == pytest.approx(2.0)
    assert keep.tolist() == [[False, True, False], [False, False, True]]
    loss, grad, _ = loss_grad(logp, old, adv, mask, token_weight=keep)
    assert loss == pytest.approx(0.0, abs=1e-12)
    assert grad.tolist() == [pytest.approx([0, -1 / 6, 0]), pytest.approx([0, 0, 1 / 6])]
    # rho 0.5: thr = 0.5 + 0.5 (1.5 - 0.5) = 1.0 -> also (1, 0), PPO-clipped: L = 0.4 / 6, same gradient
    keep = entropy_mask(H, mask, quantile=0.5)
    assert entropy_threshold(H, mask, quantile=0.5).item() == pytest.approx(1.0)
    assert keep.tolist() == [[False, True, False], [True, False, True]]
    loss, grad, _ = loss_grad(logp, old, adv, mask, token_weight=keep)
    assert loss == pytest.approx(0.066667, abs=1e-6)
    assert grad.tolist() == [pytest.approx([0, -1 / 6, 0]), pytest.approx([0, 0, 1 / 6])]


def test_entropy_mask_ties_padding_and_limits():
    H = torch.tensor([[1.0, 1.0, 1.0, 9.0], [1.0, 0.5, 7.0, 8.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # the 9, 7 and 8 are padding
    # real entropies [1, 1, 1, 1, 0.5]: quantile 0.2 -> thr = quantile(., 0.8) = 1: every 1 kept (ties), 4 > 0.2*5
    assert entropy_mask(H, mask, quantile=0.2).tolist() == [[True, True, True, False], [True, False, False, False]]
    assert torch.equal(entropy_mask(H, mask, quantile=1.0), mask.bool())  # 1 keeps every real token
    assert entropy_mask(H, mask, quantile=0.0).sum() == 4  # 0 keeps the ties with the maximum
    assert not entropy_mask(H, torch.zeros_like(mask), quantile=0.5).any()


def test_entropy_threshold_matches_torch_quantile():
    g = torch.Generator().manual_seed(3)
    H = torch.rand(7, 11, generator=g, dtype=F64)
    mask = torch.rand(7, 11, generator=g) < 0.6
    for q in (0.0, 0.1, 0.2, 0.37, 0.5, 0.9, 1.0):
        want = torch.quantile(H[mask], 1 - q)  # linear interpolation
        assert entropy_threshold(H, mask, quantile=q).item() == pytest.approx(want.item(), abs=1e-12)


# ---------------------------------------------------------------- KL estimators (variants.md §9)


def test_kl_estimators_worked_example_as_loss():
    # x = logp - ref = [[0.2, -0.1, 0], [0.5, -0.3, 0.1]], token-mean, beta = 1
    x = torch.tensor([[0.2, -0.1, 0.0], [0.5, -0.3, 0.1]], dtype=F64)
    mask = torch.ones(2, 3)
    want = {
        "k1": (0.066667, [[1 / 6] * 3] * 2),
        "k2": (0.033333, (x / 6).tolist()),
        "k3": (0.030855, [[0.030212, -0.017528, 0], [0.065578, -0.058310, 0.015860]]),
        "k3+": (0.030855, (x / 6).tolist()),  # k3's value, k2's gradient
    }
    assert set(want) == set(KL_ESTIMATORS)
    for est, (value, grad) in want.items():
        lp = x.clone().requires_grad_(True)
        loss = aggregate(kl_divergence(lp, torch.zeros_like(x), estimator=est), mask, "token-mean")
        loss.backward()
        assert loss.item() == pytest.approx(value, abs=1e-6), est
        assert lp.grad.tolist() == [pytest.approx(r, abs=1e-6) for r in grad], est


def _two_action_gradients(estimator: str) -> tuple[float, float]:
    """pi = [sigmoid(theta), 1 - sigmoid(theta)] at theta = 0, pi_ref = [0.25, 0.75]; exact expectations over
    a ~ pi of (as loss) d k(a) / d theta and (in reward) k(a) d log pi(a) / d theta (the score function)."""
    theta = torch.zeros((), dtype=F64, requires_grad=True)
    logp = torch.log_softmax(torch.stack([theta, torch.zeros((), dtype=F64)]), 0).unsqueeze(0)
    ref = torch.tensor([[math.log(0.25), math.log(0.75)]], dtype=F64)
    k = kl_divergence(logp, ref, estimator=estimator)
    pi = logp.exp().detach()
    as_loss = torch.autograd.grad((pi * k).sum(), theta, retain_graph=True)[0]
    in_reward = torch.autograd.grad((pi * k.detach() * logp).sum(), theta)[0]
    return as_loss.item(), in_reward.item()


def test_kl_estimator_gradients_on_the_exact_two_action_policy():
    # true grad KL(pi || ref) = 0.25 ln 3 = 0.274653; k1 as loss 0; k2 and k3+ as loss 0.274653; k3 as loss 0.25
    # (the forward KL's gradient); k1 in reward 0.274653; k3 in reward 0.024653 (variants.md §9 exact check)
    assert _two_action_gradients("k1") == pytest.approx((0.0, 0.274653), abs=1e-6)
    assert _two_action_gradients("k2")[0] == pytest.approx(0.274653, abs=1e-6)
    assert _two_action_gradients("k3") == pytest.approx((0.25, 0.024653), abs=1e-6)
    assert _two_action_gradients("k3+")[0] == pytest.approx(0.274653, abs=1e-6)


def test_k3_plus_keeps_k3s_clamped_value_and_k2s_unclamped_gradient():
    logp = torch.tensor([0.0, 0.0], dtype=F64, requires_grad=True)
    ref = torch.tensor([0.5, 3.0], dtype=F64)  # x = ref - logp: k3 = e^0.5 - 1.5 = 0.148721; e^3 - 4 = 16.09 -> 10
    k = kl_divergence(logp, ref, estimator="k3+")
    assert k.tolist() == pytest.approx([math.exp(0.5) - 1.5, 10.0], abs=1e-9)
    k.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-0.5, -3.0])  # d/dlogp (logp - ref)^2 / 2


# ---------------------------------------------------------------- prompt-level aggregation (variants.md §11)


def test_prompt_mean_worked_example():
    # lengths [3, 1, 2, 3], G = 2, losses [1,2,3 | 4 | 5,6 | 7,8,9]: (10/4 + 35/5) / 2 = 4.75 (weights 0.125, 0.1)
    loss = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0], [7, 8, 9]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    assert aggregate(loss, mask, "prompt-mean-token-mean", group_size=2).item() == pytest.approx(4.75)
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(5.0)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(4.875)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(11.25)
    lm = loss.clone().requires_grad_(True)
    aggregate(lm, mask, "prompt-mean-token-mean", group_size=2).backward()
    assert lm.grad.tolist() == [[0.125] * 3, [0.125, 0, 0], [0.1, 0.1, 0], [0.1] * 3]
    assert group_token_counts(mask, 2).tolist() == [4, 4, 5, 5]


def test_prompt_mean_micro_batches_and_errors():
    loss = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0], [7, 8, 9]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    kw = dict(group_size=2, total_seqs=4)
    whole = sum(aggregate(loss[s], mask[s], "prompt-mean-token-mean", **kw) for s in (slice(0, 2), slice(2, 4)))
    assert whole.item() == pytest.approx(4.75)
    counts = group_token_counts(mask, 2)
    split = sum(
        aggregate(loss[s], mask[s], "prompt-mean-token-mean", group_tokens=counts[s], **kw)
        for s in (slice(0, 1), slice(1, 3), slice(3, 4))
    )
    assert split.item() == pytest.approx(4.75)
    with pytest.raises(ValueError, match=r"group_size must be a positive int .*'prompt-mean-token-mean', got None"):
        aggregate(loss, mask, "prompt-mean-token-mean")
    with pytest.raises(ValueError, match=r"3 rows are not whole groups of group_size=2; pass group_tokens"):
        aggregate(loss[:3], mask[:3], "prompt-mean-token-mean", **kw)
    with pytest.raises(ValueError, match=r"total_seqs=5 is not a whole number of groups of group_size=2"):
        aggregate(loss, mask, "prompt-mean-token-mean", group_size=2, total_seqs=5)


# ---------------------------------------------------------------- micro-batch invariance for every new mode


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_micro_batches_sum_to_the_full_batch(surrogate, aggregation):
    logp, old, mask, _, adv_tok = random_batch(10, B=8, T=6)
    H = torch.rand(8, 6, generator=torch.Generator().manual_seed(4), dtype=F64)
    sampler = old - 0.3 * torch.randn(8, 6, generator=torch.Generator().manual_seed(5), dtype=F64)
    w, _ = mismatch_weights(old, torch.where(mask, sampler, old), mask, mode="token-truncate")
    weight = w * entropy_mask(H, mask, quantile=0.5)  # one threshold for the whole batch
    kw = dict(
        surrogate=surrogate,
        aggregation=aggregation,
        horizon=9,
        group_size=2,
        token_weight=weight,
        cov_lb=0.0,
        cov_ratio=0.2,
    )
    sel = None
    if surrogate in ("clip-cov", "kl-cov"):
        sel = cov_selection(
            logp,
            old,
            adv_tok,
            mask,
            surrogate=surrogate,
            cov_ratio=0.2,
            cov_lb=0.0,
            generator=torch.Generator().manual_seed(0),
        )
        kw["cov_selected"] = sel
    full, g_full, _ = loss_grad(logp, old, adv_tok, mask, **kw)
    totals = dict(total_tokens=int(mask.sum()), total_seqs=8, group_tokens=group_token_counts(mask, 2))
    parts, grads = 0.0, []
    for s in (slice(0, 3), slice(3, 4), slice(4, 8)):  # cuts the groups (0, 1) | (2, 3)
        part_kw = dict(kw, token_weight=weight[s], **totals)
        part_kw["group_tokens"] = totals["group_tokens"][s]
        if sel is not None:
            part_kw["cov_selected"] = sel[s]
        loss, g, _ = loss_grad(logp[s], old[s], adv_tok[s], mask[s], **part_kw)
        parts += loss
        grads.append(g)
    assert parts == pytest.approx(full, abs=1e-12)
    torch.testing.assert_close(torch.cat(grads), g_full, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- an independent implementation of variants.md


def _sigmoid(x):
    return 1 / (1 + torch.exp(-x))


def reference_loss(logp, old, adv, mask, *, surrogate, aggregation, G, horizon, weight, knobs, selected, eps):
    """variants.md written out per token, with python loops and scalars (autograd gives the gradient)."""
    B, T = mask.shape
    rows = [[t for t in range(T) if mask[i, t]] for i in range(B)]
    n_tokens = sum(map(len, rows))
    group_tokens = [sum(len(rows[j]) for j in range((i // G) * G, (i // G + 1) * G)) for i in range(B)]
    total = logp.new_zeros(())
    for i in range(B):
        if not rows[i]:
            continue
        a_of = (lambda t: adv[i]) if adv.dim() == 1 else (lambda t: adv[i, t])
        if surrogate == "gmpo":
            a_i = sum(a_of(t) for t in rows[i]) / len(rows[i])
            ds = []
            for t in rows[i]:
                d = logp[i, t] - old[i, t]
                if a_i > 0:
                    d = torch.minimum(d, torch.tensor(knobs["gmpo_eps_high"], dtype=F64))
                elif a_i < 0:
                    d = torch.maximum(d, torch.tensor(-knobs["gmpo_eps_low"], dtype=F64))
                ds.append(d)
            seq_value = -a_i * torch.exp(sum(ds) / len(ds))
        for t in rows[i]:
            a = a_of(t)
            log_r = logp[i, t] - old[i, t]
            r = torch.exp(log_r)
            if surrogate == "clip":
                ell = -torch.minimum(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a)
            elif surrogate == "cispo":
                w = min(max(r.item(), knobs["cispo_w_min"]), knobs["cispo_w_max"])
                ell = -w * a * logp[i, t]
            elif surrogate == "sapo":
                tau = knobs["sapo_tau_pos"] if a > 0 else knobs["sapo_tau_neg"]
                ell = -(4 / tau) * _sigmoid(tau * (r - 1)) * a
            elif surrogate == "gmpo":
                ell = seq_value
            elif surrogate in ("dppo-tv", "dppo-kl"):
                p, mu = math.exp(logp[i, t].item()), math.exp(old[i, t].item())
                lo, hi = knobs["dppo_delta_low"], knobs["dppo_delta_high"]
                if surrogate == "dppo-tv":
                    masked = (p - mu > hi) if a > 0 else (p - mu < -lo)
                else:
                    D = mu * math.log(mu / p) + (1 - mu) * math.log((1 - mu) / (1 - p))
                    masked = (D > hi and p > mu) if a > 0 else (D > lo and p < mu)
                ell = 0 * logp[i, t] if masked else -a * min(r.item(), knobs["dppo_cap"]) * logp[i, t]
            elif surrogate == "clip-cov":
                ppo = -torch.minimum(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a)
                ell = 0 * ppo if selected[i][t] else ppo
            else:  # kl-cov
                ell = -r * a + (knobs["kl_cov_coef"] * torch.abs(log_r) if selected[i][t] else 0)
            agg_w = {
                "token-mean": 1 / n_tokens,
                "token-sum": 1.0,
                "seq-mean-token-mean": 1 / (B * len(rows[i])),
                "seq-mean-token-sum": 1 / B,
                "seq-mean-token-sum-norm": 1 / (B * horizon),
                "prompt-mean-token-mean": 1 / ((B / G) * group_tokens[i]),
            }[aggregation]
            total = total + agg_w * weight[i][t] * ell
    return total


def reference_cov_selection(logp, adv, mask, *, surrogate, ratio, lb, ub):
    """Cov over the real tokens; KL-Cov: the k largest; Clip-Cov: every candidate with lb < Cov < ub (the caller
    passes a ratio large enough to take them all, and a PPO range that clips nothing)."""
    B, T = mask.shape
    toks = [(i, t) for i in range(B) for t in range(T) if mask[i, t]]
    a = {(i, t): float(adv[i] if adv.dim() == 1 else adv[i, t]) for i, t in toks}
    lp = {(i, t): float(logp[i, t]) for i, t in toks}
    mean_a, mean_lp = sum(a.values()) / len(toks), sum(lp.values()) / len(toks)
    cov = {k: (a[k] - mean_a) * (lp[k] - mean_lp) for k in toks}
    n = max(int(ratio * len(toks)), 1)
    if surrogate == "kl-cov":
        chosen = set(sorted(toks, key=lambda k: -cov[k])[:n])
    else:
        chosen = {k for k in toks if lb < cov[k] < ub}
    return [[(i, t) in chosen for t in range(T)] for i in range(B)]


KNOBS = dict(
    cispo_w_min=0.9,
    cispo_w_max=1.1,
    sapo_tau_pos=1.3,
    sapo_tau_neg=2.0,
    gmpo_eps_low=0.2,
    gmpo_eps_high=0.3,
    dppo_delta_low=0.05,
    dppo_delta_high=0.08,
    dppo_cap=1.3,
    kl_cov_coef=0.7,
)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_independent_reimplementation_on_random_padded_batches(surrogate, aggregation):
    seen = 0.0
    for seed, per_token, weighted in itertools.product((11, 12), (False, True), (False, True)):
        logp, old, mask, adv_seq, adv_tok = random_batch(seed, B=6, T=7, off=0.4)
        adv = adv_tok if per_token else adv_seq
        weight = (
            torch.rand(6, 7, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2
            if weighted
            else torch.ones(6, 7, dtype=F64)
        )
        # Clip-Cov: a PPO range that clips nothing and a ratio that takes every candidate make the draw deterministic
        eps = 1e9 if surrogate == "clip-cov" else 0.2
        kw = dict(
            surrogate=surrogate,
            aggregation=aggregation,
            horizon=9,
            group_size=2,
            token_weight=weight if weighted else None,
            eps_low=eps,
            eps_high=eps,
            **KNOBS,
        )
        selected = None
        if surrogate in ("clip-cov", "kl-cov"):
            cov_kw = dict(ratio=0.15 if surrogate == "kl-cov" else 1.0, lb=0.05, ub=5.0)
            kw.update(cov_ratio=cov_kw["ratio"], cov_lb=cov_kw["lb"], cov_ub=cov_kw["ub"])
            selected = reference_cov_selection(logp, adv, mask, surrogate=surrogate, **cov_kw)
        loss, grad, m = loss_grad(logp, old, adv, mask, **kw)
        lp = logp.detach().clone().requires_grad_(True)
        ref = reference_loss(
            lp,
            old,
            adv,
            mask,
            surrogate=surrogate,
            aggregation=aggregation,
            G=2,
            horizon=9,
            weight=weight.tolist(),
            knobs=KNOBS,
            selected=selected,
            eps=eps,
        )
        ref.backward()
        assert loss == pytest.approx(ref.item(), abs=1e-6)
        torch.testing.assert_close(grad, lp.grad, atol=1e-6, rtol=0)
        assert torch.isfinite(grad).all() and (grad[~mask] == 0).all()
        seen += sum(
            m.get(k, 0.0)
            for k in (
                "clip_frac_low",
                "clip_frac_high",
                "is_clip_frac_low",
                "is_clip_frac_high",
                "gmpo_clip_frac",
                "dppo_mask_frac",
                "cov_selected_frac",
            )
        )
    # the random batches really exercise each variant's clip / mask / selection
    assert seen > 0


def test_independent_mismatch_weights_on_random_batches():
    for seed in range(3):
        _, old, mask, _, _ = random_batch(20 + seed, B=5, T=8)
        g = torch.Generator().manual_seed(seed)
        sampler = torch.where(mask, old + 0.4 * torch.randn(5, 8, generator=g, dtype=F64), old)
        B, T = mask.shape
        for mode, (lo, hi) in itertools.product(MISMATCH_MODES, [(None, 2.0), (0.5, 1.5), (0.8, 3.0)]):
            if mode == "icepop" and lo is None:
                continue
            w, _ = mismatch_weights(old, sampler, mask, mode=mode, c_min=lo, c_max=hi)
            low = 0.0 if lo is None else lo
            for i in range(B):
                real = [t for t in range(T) if mask[i, t]]
                prod = math.exp(sum(old[i, t].item() - sampler[i, t].item() for t in real))
                for t in range(T):
                    if t not in real:
                        assert w[i, t] == 0
                        continue
                    rho = prod if mode.startswith("sequence") else math.exp(old[i, t].item() - sampler[i, t].item())
                    want = min(max(rho, low), hi) if mode.endswith("truncate") else (rho if low <= rho <= hi else 0.0)
                    assert w[i, t].item() == pytest.approx(want, rel=1e-9, abs=1e-12), (mode, i, t)


def test_independent_kl_estimators_on_random_batches():
    g = torch.Generator().manual_seed(30)
    logp = -torch.rand(4, 9, generator=g, dtype=F64) * 4
    ref = logp + torch.randn(4, 9, generator=g, dtype=F64) * 2.5  # some k3 values above verl's clamp of 10
    mask = torch.rand(4, 9, generator=g) < 0.7
    for est in KL_ESTIMATORS:
        lp = logp.clone().requires_grad_(True)
        k = kl_divergence(lp, ref, estimator=est, mask=mask)
        k.sum().backward()
        for i, t in itertools.product(range(4), range(9)):
            if not mask[i, t]:
                assert k[i, t] == 0 and lp.grad[i, t] == 0
                continue
            d = lp[i, t].item() - ref[i, t].item()  # logp - ref
            x = min(max(-d, -20.0), 20.0)  # verl: ref - logp clamped to +-20
            k3 = math.exp(x) - x - 1
            value = {"k1": d, "k2": d * d / 2, "k3": min(max(k3, -10), 10), "k3+": min(max(k3, -10), 10)}[est]
            grad = {"k1": 1.0, "k2": d, "k3": (1 - math.exp(-d)) if k3 <= 10 else 0.0, "k3+": d}[est]
            assert k[i, t].item() == pytest.approx(value, rel=1e-9, abs=1e-12), (est, i, t)
            assert lp.grad[i, t].item() == pytest.approx(grad, rel=1e-9, abs=1e-12), (est, i, t)


# ---------------------------------------------------------------- bad input names the knob


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(surrogate="ppo"), r"surrogate must be one of 'clip', 'cispo', .*got 'ppo'"),
        (dict(surrogate="cispo", ratio="sequence"), r"surrogate='cispo' takes ratio in 'token', got 'sequence'"),
        (dict(surrogate="sapo", ratio="hybrid", seq_eps_low=0.1, seq_eps_high=0.1), r"surrogate='sapo' takes ratio in"),
        (dict(surrogate="cispo", dual_clip=3.0), r"dual_clip applies to surrogate='clip' only"),
        (dict(surrogate="cispo", cispo_w_max=0.0), r"algorithm\.clip\.cispo_w_max=0\.0 must be a number > 0 or null; "),
        (
            dict(surrogate="cispo", cispo_w_min=2.0, cispo_w_max=1.0),
            r"algorithm\.clip\.cispo_w_min=2\.0 must be <= algorithm\.clip\.cispo_w_max=1\.0",
        ),
        (dict(surrogate="sapo", sapo_tau_neg=0.0), r"algorithm\.clip\.sapo_tau_neg=0\.0 must be a number > 0; "),
        (dict(surrogate="gmpo", gmpo_eps_low=-1.0), r"algorithm\.clip\.gmpo_eps_low=-1\.0 must be a number >= 0; "),
        (dict(surrogate="dppo-tv", dppo_cap=0.0), r"algorithm\.clip\.dppo_cap=0\.0 must be a number > 0; "),
        (
            dict(surrogate="dppo-kl", dppo_delta_high=-0.1),
            r"algorithm\.clip\.dppo_delta_high=-0\.1 must be a number >= 0; ",
        ),
        (dict(surrogate="clip-cov", cov_ratio=0.0), r"algorithm\.clip\.cov_ratio=0\.0 must be in \(0, 1\]"),
        (
            dict(surrogate="clip-cov", cov_lb=5.0, cov_ub=1.0),
            r"algorithm\.clip\.cov_lb=5\.0 must be < algorithm\.clip\.cov_ub=1\.0",
        ),
        (dict(surrogate="kl-cov", kl_cov_coef=-1.0), r"algorithm\.clip\.kl_cov_coef=-1\.0 must be a number >= 0; "),
        (dict(token_weight=torch.ones(2, 4)), r"token_weight must be \[B, T\] = \(2, 3\)"),
        (dict(surrogate="clip-cov", cov_selected=torch.ones(3, 3, dtype=torch.bool)), r"cov_selected must be \[B, T\]"),
    ],
)
def test_policy_loss_bad_variant_settings(kw, match):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, torch.ones(2), torch.ones(2, 3), **kw)


def test_bad_mismatch_and_entropy_settings():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"mode must be one of 'token-truncate', .*got 'tis'"):
        mismatch_weights(x, x, m, mode="tis")
    with pytest.raises(ValueError, match=r"c_max must be a finite number > 0"):
        mismatch_weights(x, x, m, mode="token-mask", c_max=float("inf"))
    with pytest.raises(ValueError, match=r"c_min must be a number in \[0, c_max=2.0\] or None"):
        mismatch_weights(x, x, m, mode="token-mask", c_min=3.0)
    with pytest.raises(ValueError, match=r"quantile must be in \[0, 1\]"):
        entropy_mask(x, m, quantile=1.5)
    with pytest.raises(ValueError, match=r"surrogate must be one of 'clip-cov', 'kl-cov', got 'clip'"):
        cov_selection(x, x, torch.ones(2), m, surrogate="clip")
