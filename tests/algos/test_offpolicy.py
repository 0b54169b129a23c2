"""The corrections for stale rollouts (issue 44, docs/algorithms.md §8), on numbers worked by hand.

Worked example (the shared example E of docs/variants.md, with a behaviour policy): B = 2, T = 3, every token real,
A = [+1, -0.5]; the ratio to the proximal policy pi_theta/pi_prox = [[1.5, 1, 0.5], [0.7, 1.25, 2]] (PPO's loss on it,
eps 0.2, token-mean: l = [[-1.2, -1, -0.5], [0.4, 0.625, 1]], L = -0.1125, dL/dlogp = [[0, -1/6, -1/12],
[0, 0.104167, 0.166667]]) and the behaviour weight w = pi_prox/pi_behav = [[1.2, 0.5, 6], [1, 2.5, 0.9]].
"""

from __future__ import annotations

import math

import pytest
import torch

from rlcompare.algos import losses, offpolicy

F64 = torch.float64
REAL = torch.ones(2, 3, dtype=torch.bool)
ADV = torch.tensor([1.0, -0.5], dtype=F64)
BEHAV = torch.full((2, 3), -1.0, dtype=F64)
PPO_RATIO = torch.tensor([[1.5, 1.0, 0.5], [0.7, 1.25, 2.0]], dtype=F64)
W = torch.tensor([[1.2, 0.5, 6.0], [1.0, 2.5, 0.9]], dtype=F64)


def _decoupled_loss(cap, cap_mode):
    """Decoupled PPO on the example: the clip around the proximal policy, times the behaviour weight."""
    prox = BEHAV + W.log()
    weight, metrics = offpolicy.decoupled_weights(prox, BEHAV, REAL, cap=cap, cap_mode=cap_mode)
    logp = (prox + PPO_RATIO.log()).requires_grad_()
    loss, _ = losses.policy_loss(logp, prox, ADV, REAL, aggregation="token-mean", token_weight=weight)
    loss.backward()
    return weight, metrics, float(loss.detach()), logp.grad


def test_decoupled_ppo_uncapped_multiplies_each_clipped_term_by_the_behaviour_weight():
    # l * w = [[-1.44, -0.5, -3.0], [0.4, 1.5625, 0.9]]: sum -2.0775, / 6 = -0.34625;
    # the gradient w * PPO's: [[0, -0.083333, -0.5], [0, 0.260417, 0.15]]
    weight, metrics, loss, grad = _decoupled_loss(None, "mask")
    assert torch.allclose(weight, W)
    assert loss == pytest.approx(-0.34625)
    assert torch.allclose(grad, torch.tensor([[0, -1 / 12, -0.5], [0, 0.2604167, 0.15]], dtype=F64), atol=1e-6)
    assert metrics == pytest.approx({"weight_mean": 12.1 / 6, "masked_frac": 0.0, "truncated_frac": 0.0})


def test_decoupled_ppo_capped_as_areals_behav_imp_weight_cap_masks_the_token_above_it():
    # cap 5 (AReaL's recommendation), mask: w = 6 -> 0: (-1.44 - 0.5 + 0.4 + 1.5625 + 0.9) / 6 = 0.15375
    weight, metrics, loss, grad = _decoupled_loss(5.0, "mask")
    assert weight[0, 2] == 0 and weight[1, 1] == 2.5
    assert loss == pytest.approx(0.15375)
    assert grad[0, 2] == 0
    assert metrics["masked_frac"] == pytest.approx(1 / 6) and metrics["truncated_frac"] == 0


def test_decoupled_ppo_truncated_caps_the_weight():
    # truncate at 5: w = 6 -> 5: (-1.44 - 0.5 - 2.5 + 0.4 + 1.5625 + 0.9) / 6 = -0.262917; (0,2)'s gradient -5/12
    weight, metrics, loss, grad = _decoupled_loss(5.0, "truncate")
    assert weight[0, 2] == 5
    assert loss == pytest.approx(-0.2629167, abs=1e-6)
    assert float(grad[0, 2]) == pytest.approx(-5 / 12)
    assert metrics["truncated_frac"] == pytest.approx(1 / 6) and metrics["masked_frac"] == 0


def test_decoupled_with_a_cap_equals_the_mismatch_weights_on_the_same_two_log_probs():
    # the composition trainer.recompute_old_logp=true + algorithm.mismatch.mode=token-mask|token-truncate (c_max=cap)
    prox = BEHAV + W.log()
    for cap_mode, mode in (("mask", "token-mask"), ("truncate", "token-truncate")):
        mine, _ = offpolicy.decoupled_weights(prox, BEHAV, REAL, cap=3.0, cap_mode=cap_mode)
        theirs, _ = losses.mismatch_weights(prox, BEHAV, REAL, mode=mode, c_max=3.0)
        assert torch.equal(mine, theirs)


def test_geometric_sequence_mask_keeps_a_row_whose_mean_log_ratio_stays_within_delta():
    # log(pi_prox/pi_behav) per row: [0.01, -0.02, 0.025] -> mean 0.005, g = 1.005013 (kept, although its third
    # token alone, 1.0253, is outside [0.99, 1.01]); [0.03, 0, 0.006] -> mean 0.012, g = 1.012072 > 1.01 (dropped);
    # [-0.05, 0.02, pad] -> mean -0.015 over its 2 real tokens, g = 0.985112 < 0.99 (dropped)
    d = torch.tensor([[0.01, -0.02, 0.025], [0.03, 0.0, 0.006], [-0.05, 0.02, 7.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    keep, metrics = offpolicy.geo_sequence_mask(d, torch.zeros_like(d), mask, delta=0.01)
    assert keep.tolist() == [[1, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert metrics == pytest.approx(
        {"masked_seq_frac": 2 / 3, "over_high_frac": 1 / 3, "under_low_frac": 1 / 3, "masked_token_frac": 5 / 8}
    )
    # delta = 0.02 keeps both others too: 1.012072 <= 1.02 and 0.985112 >= 0.98
    keep, _ = offpolicy.geo_sequence_mask(d, torch.zeros_like(d), mask, delta=0.02)
    assert keep.tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0]]


def test_m2po_masks_the_largest_squared_log_ratio_among_the_trust_region_tokens():
    # d = log(pi_prox/pi_behav) = log of [[1.5, 1, 0.5], [0.7, 1.25, 2]]; trust-region tokens (A > 0 and r > 1, A < 0
    # and r < 1): (0,0) with d^2 = 0.405465^2 = 0.164402 and (1,0) with 0.356675^2 = 0.127217; mean 0.145809.
    # tau = 0.13: mask (0,0), then the mean is 0.127217 <= 0.13: stop
    prox = BEHAV + PPO_RATIO.log()
    keep, metrics = offpolicy.m2po_mask(prox, BEHAV, ADV, REAL, threshold=0.13)
    assert keep.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert metrics == pytest.approx(
        {"masked_frac": 1 / 6, "candidate_frac": 2 / 6, "m2": 0.1458095, "m2_after": 0.1272170}, abs=1e-6
    )
    # tau = 0.04 (the paper's): one candidate left at 0.127217 > 0.04 goes too (the paper's loop empties T)
    keep, metrics = offpolicy.m2po_mask(prox, BEHAV, ADV, REAL, threshold=0.04)
    assert keep.tolist() == [[0, 1, 1], [0, 1, 1]]
    assert metrics["m2_after"] == 0


def test_m2po_over_all_tokens_as_areal_stops_when_the_rest_are_under_the_threshold():
    # every token: d^2 sorted = [0.480453 (0,2), 0.480453 (1,2), 0.164402, 0.127217, 0.049793, 0]; means of what is
    # left after masking 0..4 of them: 0.217053, 0.164373, 0.085353, 0.059003, 0.024897 <= 0.04 -> 4 masked
    prox = BEHAV + PPO_RATIO.log()
    keep, metrics = offpolicy.m2po_mask(prox, BEHAV, ADV, REAL, threshold=0.04, tokens="all")
    assert keep.tolist() == [[0, 1, 0], [0, 1, 0]]
    assert metrics == pytest.approx(
        {"masked_frac": 4 / 6, "candidate_frac": 1.0, "m2": 0.2170530, "m2_after": 0.0248965}, abs=1e-6
    )


def test_m2po_masks_nothing_under_the_threshold_and_ignores_padding():
    d = torch.tensor([[0.1, -0.1, 50.0]], dtype=F64)  # the padded 50 would be masked if it counted
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    keep, metrics = offpolicy.m2po_mask(d, torch.zeros_like(d), torch.ones(1, dtype=F64), mask, tokens="all")
    assert keep.tolist() == [[1, 1, 0]]
    assert metrics["m2"] == pytest.approx(0.01) and metrics["masked_frac"] == 0


def test_the_logged_gap_is_the_mean_and_max_absolute_log_ratio_over_real_tokens():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], dtype=F64)
    behav = torch.tensor([[-1.5, -1.0, -3.0], [-0.25, -0.5, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    # |d| on real tokens: 0.5, 1.0, 0, 0.25, 0 -> mean 0.35, max 1.0 (the padded 9 is not one)
    assert offpolicy.behaviour_gap(logp, behav, mask) == pytest.approx(
        {"log_ratio_abs_mean": 0.35, "log_ratio_abs_max": 1.0}
    )


def test_the_dispatcher_uses_the_knobs_and_refuses_bad_ones():
    prox = BEHAV + W.log()
    w, _ = offpolicy.correction_weights("decoupled", prox, BEHAV, ADV, REAL, decoupled_cap=2.0)
    assert float(w.max()) == pytest.approx(1.2)  # 2.5 and 6 masked above 2
    keep, _ = offpolicy.correction_weights("geo-mask", prox, BEHAV, ADV, REAL)
    assert float(keep.sum()) == 0  # both rows' geometric means (1.5326, 1.3104) are far outside [0.99, 1.01]
    assert math.isclose(float(torch.exp(W.log().mean(1))[0]), 3.6 ** (1 / 3))
    for bad, match in (
        (dict(decoupled_cap=0.0), "decoupled_cap"),
        (dict(geo_delta=1.0), "geo_delta"),
        (dict(m2po_threshold=0), "m2po_threshold"),
        (dict(m2po_tokens="some"), "m2po_tokens"),
    ):
        with pytest.raises(ValueError, match=match):
            offpolicy.correction_weights("m2po", prox, BEHAV, ADV, REAL, **bad)
    with pytest.raises(ValueError, match="correction"):
        offpolicy.correction_weights("tis", prox, BEHAV, ADV, REAL)


def test_the_capped_decoupled_weight_clamps_the_log_gap_at_20_as_the_uncapped_one():
    # d = log(pi_prox/pi_behav) = [25, -25, 0.5]: clamped to [20, -20, 0.5] before exp (docs/algorithms.md §8.1);
    # e^20 = 4.85165e8, e^-20 = 2.06115e-9, e^0.5 = 1.648721
    d = torch.tensor([[25.0, -25.0, 0.5]], dtype=F64)
    real = torch.ones(1, 3, dtype=torch.bool)
    zero = torch.zeros_like(d)
    e20, e_20, half = 4.851651954e8, 2.061153622e-9, 1.6487212707
    uncapped, _ = offpolicy.decoupled_weights(d, zero, real, cap=None)
    assert uncapped[0].tolist() == pytest.approx([e20, e_20, half], rel=1e-9)
    masked, m = offpolicy.decoupled_weights(d, zero, real, cap=5.0, cap_mode="mask")
    assert masked[0].tolist() == pytest.approx([0.0, e_20, half], rel=1e-9)  # not e^-25 = 1.38879e-11
    assert m["masked_frac"] == pytest.approx(1 / 3)
    truncated, _ = offpolicy.decoupled_weights(d, zero, real, cap=5.0, cap_mode="truncate")
    assert truncated[0].tolist() == pytest.approx([5.0, e_20, half], rel=1e-9)
    # a cap above e^20: the clamped e^20 is under it and kept (unclamped, e^25 = 7.2e10 would be masked)
    big, _ = offpolicy.decoupled_weights(d, zero, real, cap=1e10, cap_mode="mask")
    assert big[0].tolist() == pytest.approx([e20, e_20, half], rel=1e-9)


def test_with_no_real_token_the_decoupled_metrics_are_0_with_or_without_a_cap():
    d = torch.tensor([[0.3, -0.2]], dtype=F64)
    none = torch.zeros(1, 2, dtype=torch.bool)
    expected = {"weight_mean": 0.0, "masked_frac": 0.0, "truncated_frac": 0.0}
    for cap, cap_mode in ((None, "mask"), (5.0, "mask"), (5.0, "truncate")):
        w, m = offpolicy.decoupled_weights(d, torch.zeros_like(d), none, cap=cap, cap_mode=cap_mode)
        assert w.tolist() == [[0.0, 0.0]] and m == expected, (cap, cap_mode)


def test_the_geometric_mask_clamps_each_token_before_the_mean_not_the_mean():
    # docs/algorithms.md §8.2: d = [25, -20] -> per token [20, -20] -> mean 0 -> g = exp(0) = 1: kept;
    # SkyRL's clamp of the mean would give mean 2.5 -> exp(2.5) = 12.18249 (dropped)
    d = torch.tensor([[25.0, -20.0]], dtype=F64)
    real = torch.ones(1, 2, dtype=torch.bool)
    keep, metrics = offpolicy.geo_sequence_mask(d, torch.zeros_like(d), real, delta=0.01)
    assert keep.tolist() == [[1.0, 1.0]] and metrics["masked_seq_frac"] == 0.0
    assert math.exp(2.5) == pytest.approx(12.18249, abs=1e-5)
    clamped = offpolicy.behaviour_log_ratio(d, torch.zeros_like(d), real)
    assert clamped.tolist() == [[20.0, -20.0]] and float(clamped.mean()) == 0.0
