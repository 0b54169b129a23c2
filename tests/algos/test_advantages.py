"""Advantage estimators against hand-worked numbers and readable reference loops."""

import math

import pytest
import torch

from rlcompare.algos.advantages import (
    gae_advantages,
    group_advantages,
    informative_groups,
    rloo_advantages,
    whiten,
)


# ---------------------------------------------------------------- group (GRPO / Dr. GRPO / Lite-PPO)


def test_grpo_worked_example_population_std():
    # algorithms.md §1: rewards [2, 10, 3], mean 5, deviations [-3, 5, -2];
    # ddof 0: var = (9 + 25 + 4) / 3 = 38/3, std = 3.559
    A = group_advantages(torch.tensor([2.0, 10.0, 3.0]), 3, std_ddof=0, eps=0.0)
    std = math.sqrt(38 / 3)
    assert A.tolist() == pytest.approx([-3 / std, 5 / std, -2 / std], abs=1e-6)
    assert A.tolist() == pytest.approx([-0.843, 1.405, -0.562], abs=1e-3)


def test_grpo_worked_example_sample_std():
    # ddof 1: var = 38 / 2 = 19, std = 4.359
    A = group_advantages(torch.tensor([2.0, 10.0, 3.0]), 3, std_ddof=1, eps=0.0)
    std = math.sqrt(19)
    assert A.tolist() == pytest.approx([-3 / std, 5 / std, -2 / std], abs=1e-6)
    assert A.tolist() == pytest.approx([-0.688, 1.147, -0.459], abs=1e-3)


def test_grpo_default_is_sample_std_with_eps():
    A = group_advantages(torch.tensor([2.0, 10.0, 3.0]), 3)
    assert A[1].item() == pytest.approx(5 / (math.sqrt(19) + 1e-6), rel=1e-6)


def test_groups_are_independent_and_contiguous():
    # two groups of 2: [0, 1] -> mean 0.5, sample std sqrt(0.5); [4, 8] -> mean 6, std sqrt(8)
    A = group_advantages(torch.tensor([0.0, 1.0, 4.0, 8.0]), 2, eps=0.0)
    s1, s2 = math.sqrt(0.5), math.sqrt(8.0)
    assert A.tolist() == pytest.approx([-0.5 / s1, 0.5 / s1, -2 / s2, 2 / s2], abs=1e-6)


def test_scale_none_centres_only_dr_grpo():
    A = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 2.0]), 3, scale="none")
    # group 1 mean 1/3; group 2 mean 8/3
    assert A.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 1 - 8 / 3, 5 - 8 / 3, 2 - 8 / 3], abs=1e-6)


def test_scale_batch_centres_per_group_scales_by_batch_std():
    # rewards [0, 1 | 2, 2]; group means 0.5, 2 -> centred [-0.5, 0.5, 0, 0]
    # batch mean 1.25; squared deviations 1.5625 + 0.0625 + 0.5625 + 0.5625 = 2.75; ddof 1 -> var 2.75/3
    A = group_advantages(torch.tensor([0.0, 1.0, 2.0, 2.0]), 2, scale="batch", eps=0.0)
    std = math.sqrt(2.75 / 3)
    assert A.tolist() == pytest.approx([-0.5 / std, 0.5 / std, 0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_all_equal_group_gives_exact_zero(scale):
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7])
    A = group_advantages(rewards, 3, scale=scale)
    assert torch.equal(A, torch.zeros(6))
    assert torch.isfinite(A).all()


def test_integer_rewards_accepted():
    A = group_advantages(torch.tensor([1, 0]), 2, scale="none")
    assert A.dtype.is_floating_point and A.tolist() == [0.5, -0.5]


def test_group_errors_name_the_argument():
    r = torch.zeros(6)
    with pytest.raises(ValueError, match=r"scale must be one of 'group', 'batch', 'batch-centered', 'none', got 'x'"):
        group_advantages(r, 3, scale="x")
    with pytest.raises(ValueError, match=r"group_size=1.*group advantages need group_size >= 2"):
        group_advantages(r, 1)
    with pytest.raises(ValueError, match=r"rewards length 6 is not divisible by group_size=4"):
        group_advantages(r, 4)
    with pytest.raises(ValueError, match=r"std_ddof must be 0 .* or 1"):
        group_advantages(r, 3, std_ddof=2)
    with pytest.raises(ValueError, match=r"rewards must be 1-D"):
        group_advantages(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match=r"group_size=1"):
        rloo_advantages(r, 1)


# ---------------------------------------------------------------- RLOO


def test_rloo_hand_case():
    # [1, 0, 0, 0]: A_0 = 1 - mean(0,0,0) = 1; A_j = 0 - mean(1,0,0) = -1/3
    A = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    assert A.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=1e-6)


def test_rloo_matches_leave_one_out_definition():
    g = torch.Generator().manual_seed(0)
    G = 5
    rewards = torch.randn(4 * G, generator=g, dtype=torch.float64)
    A = rloo_advantages(rewards, G)
    r = rewards.tolist()
    for i in range(len(r)):
        start = (i // G) * G
        others = [r[j] for j in range(start, start + G) if j != i]
        assert A[i].item() == pytest.approx(r[i] - sum(others) / len(others), abs=1e-12)
        # equivalent form G/(G-1) * (R_i - mean)
        mean = sum(r[start : start + G]) / G
        assert A[i].item() == pytest.approx(G / (G - 1) * (r[i] - mean), abs=1e-12)


# ---------------------------------------------------------------- GAE


def gae_reference(rewards, values, mask, gamma, lam):
    """Readable double loop: each row's real tokens in order; V after the last one = 0."""
    B, T = len(mask), len(mask[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        idx = [t for t in range(T) if mask[i][t]]
        running = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            v_next = values[i][idx[k + 1]] if k + 1 < len(idx) else 0.0
            delta = rewards[i][t] + gamma * v_next - values[i][t]
            running = delta + gamma * lam * running
            adv[i][t] = running
            ret[i][t] = running + values[i][t]
    return adv, ret


def test_gae_hand_case_gamma_lambda_one():
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t = 1 - V_t; returns = 1
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask)
    assert adv.tolist()[0] == pytest.approx([0.5, 0.4, 0.3, 0.0], abs=1e-6)
    assert ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0, 0.0], abs=1e-6)


def test_gae_hand_case_discounted():
    # one token row + two token row, gamma 0.5, lam 0.5
    # row: r=[0, 2], V=[1, 1]: delta_1 = 2 - 1 = 1; delta_0 = 0 + 0.5*1 - 1 = -0.5
    # A_1 = 1; A_0 = -0.5 + 0.25 * 1 = -0.25
    adv, ret = gae_advantages(
        torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), gamma=0.5, lam=0.5
    )
    assert adv.tolist()[0] == pytest.approx([-0.25, 1.0])
    assert ret.tolist()[0] == pytest.approx([0.75, 2.0])


def _random_case(seed, B=5, T=7):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1, 1],  # full
            [1, 1, 1, 0, 0, 0, 0],  # right padded
            [0, 0, 1, 1, 1, 1, 0],  # left + right padded
            [0, 0, 0, 0, 0, 0, 0],  # empty (e.g. overlong-filtered)
            [1, 0, 1, 1, 0, 1, 0],  # holes (e.g. tool tokens masked out)
        ]
    )[:B, :T]
    return rewards, values, mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8)])
def test_gae_matches_reference_loop(gamma, lam):
    rewards, values, mask = _random_case(1)
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    assert torch.allclose(adv, torch.tensor(ref_adv, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(ret, torch.tensor(ref_ret, dtype=torch.float64), atol=1e-10)


def test_gae_padding_invariance():
    rewards, values, mask = _random_case(2)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.95)
    pad = ~mask.bool()
    # garbage (even inf/nan) at padded positions
    r2, v2 = rewards.clone(), values.clone()
    r2[pad] = 1e6
    v2[pad] = float("nan")
    adv2, ret2 = gae_advantages(r2, v2, mask.bool(), gamma=1.0, lam=0.95)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    # extra padding columns appended on the right
    extra = torch.full((rewards.shape[0], 3), 7.0, dtype=torch.float64)
    adv3, ret3 = gae_advantages(
        torch.cat([rewards, extra], 1),
        torch.cat([values, extra], 1),
        torch.cat([mask, torch.zeros(5, 3, dtype=mask.dtype)], 1),
        gamma=1.0,
        lam=0.95,
    )
    assert torch.equal(adv3[:, :7], adv) and torch.equal(ret3[:, :7], ret)
    assert torch.equal(adv3[:, 7:], torch.zeros(5, 3, dtype=torch.float64))
    # padded positions output 0
    assert torch.equal(adv[pad], torch.zeros_like(adv[pad])) and torch.equal(ret[pad], torch.zeros_like(ret[pad]))


def test_gae_float_mask_same_as_bool():
    rewards, values, mask = _random_case(3)
    a1, r1 = gae_advantages(rewards, values, mask.bool())
    a2, r2 = gae_advantages(rewards, values, mask.double())
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


def test_gae_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="token_rewards, values and mask must all be"):
        gae_advantages(x, torch.zeros(2, 4), x)
    with pytest.raises(ValueError, match="lam must be in"):
        gae_advantages(x, x, x, lam=1.5)
    with pytest.raises(ValueError, match="gamma must be in"):
        gae_advantages(x, x, x, gamma=-0.1)


# ---------------------------------------------------------------- whiten


def test_whiten_hand_case():
    # real values [1, 3, 5]: mean 3, sample var (4 + 0 + 4) / 2 = 4, std 2 -> [-1, 0, 1]
    v = torch.tensor([[1.0, 3.0, 100.0], [5.0, -50.0, 100.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = whiten(v, m)
    assert out.tolist()[0] == pytest.approx([-1.0, 0.0, 0.0], abs=1e-6)
    assert out.tolist()[1] == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    # scale only: mean added back -> [2, 3, 4]
    out = whiten(v, m.bool(), shift_mean=False)
    assert out.tolist()[0] == pytest.approx([2.0, 3.0, 0.0], abs=1e-6)
    assert out.tolist()[1] == pytest.approx([4.0, 0.0, 0.0], abs=1e-6)


def test_whiten_degenerate_masks_are_finite():
    assert torch.equal(whiten(torch.ones(2, 3), torch.zeros(2, 3)), torch.zeros(2, 3))
    one = whiten(torch.full((1, 2), 5.0), torch.tensor([[1, 0]]))
    assert torch.isfinite(one).all() and one.tolist() == [[0.0, 0.0]]


# ---------------------------------------------------------------- informative groups


def test_informative_groups():
    out = informative_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0]), 2)
    assert out.dtype == torch.bool and out.tolist() == [False, True, False]
    assert informative_groups(torch.tensor([0.0, 0.0, 0.0, 0.0]), 4).tolist() == [False]
    with pytest.raises(ValueError, match="not divisible by group_size=4"):
        informative_groups(torch.zeros(6), 4)


def test_informative_groups_reexported_from_losses():
    from rlcompare.algos import losses

    assert losses.informative_groups is informative_groups
