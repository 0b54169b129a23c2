"""On-policy distillation's advantage (rlcompare.algos.distill), worked by hand (docs/algorithms.md section 9).

The two-token example: the teacher gives the sampled tokens probabilities 1/2 and 1/4, the student that sampled
them 1/4 and 1/2, so A = [ln 2, -ln 2] = [0.693147, -0.693147]; with a discount of 1/2 the first token also takes
half the second's, 0.693147 - 0.346574 = 0.346574."""

import math

import pytest
import torch

from rlcompare.algos.distill import distill_advantages, mixed_advantages
from rlcompare.algos.losses import policy_loss

LN2 = math.log(2.0)
TEACHER = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])  # the third position is padding
STUDENT = torch.tensor([[math.log(0.25), math.log(0.5), -3.0]])
MASK = torch.tensor([[1, 1, 0]])


def test_the_advantage_is_the_teachers_log_prob_minus_the_samplers():
    d = distill_advantages(TEACHER, STUDENT, MASK)
    assert torch.allclose(d.advantages, torch.tensor([[LN2, -LN2, 0.0]]), atol=1e-6)
    assert d.nonfinite == 0


def test_a_discount_adds_the_later_tokens_terms():
    d = distill_advantages(TEACHER, STUDENT, MASK, discount=0.5)
    assert torch.allclose(d.advantages, torch.tensor([[LN2 - 0.5 * LN2, -LN2, 0.0]]), atol=1e-6)  # 0.346574, -0.693147


def test_the_losss_per_token_terms_are_minus_the_advantage_at_ratio_one():
    """token-mean over the two real tokens at ratio 1: loss = -(ln 2 - ln 2)/2 = 0, per-token terms -A_t; the
    gradient of token t's log-prob is -A_t / 2 (the mean's 1/2)."""
    a = distill_advantages(TEACHER, STUDENT, MASK).advantages
    logp = STUDENT.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, STUDENT, a, MASK, aggregation="token-mean")
    loss.backward()
    assert abs(float(loss.detach())) < 1e-6
    assert torch.allclose(logp.grad, torch.tensor([[-LN2 / 2, LN2 / 2, 0.0]]), atol=1e-6)


def test_a_teacher_identical_to_the_student_gives_no_distillation_gradient():
    """opd with coef = 1 and teacher = student: the distillation term is 0 everywhere, so the gradient is the
    reward's alone (here the reward's advantage is 0 too: no gradient at all)."""
    d = distill_advantages(STUDENT, STUDENT, MASK)
    mixed, metrics = mixed_advantages(torch.zeros(1), d.advantages, MASK, coef=1.0)
    logp = STUDENT.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, STUDENT, mixed, MASK, aggregation="token-mean")
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0
    assert metrics["distill/distill_term_abs_per_token"] == 0.0 and metrics["distill/reverse_kl"] == 0.0


def test_the_mix_adds_coef_times_the_rewards_advantage_and_logs_each_term():
    """coef 2, reward advantage 0.5 for the one response: [1 + ln 2, 1 - ln 2] on its tokens; the reward term
    carries |2 * 0.5| = 1.0 per token and per response, the distillation term (|ln 2| + |-ln 2|)/2 = ln 2, and the
    reverse KL estimate -(ln 2 - ln 2)/2 = 0."""
    d = distill_advantages(TEACHER, STUDENT, MASK)
    mixed, m = mixed_advantages(torch.tensor([0.5]), d.advantages, MASK, coef=2.0)
    assert torch.allclose(mixed, torch.tensor([[1 + LN2, 1 - LN2, 0.0]]), atol=1e-6)
    assert m["distill/reward_term_abs_per_token"] == pytest.approx(1.0)
    assert m["distill/reward_term_abs_per_response"] == pytest.approx(1.0)
    assert m["distill/distill_term_abs_per_token"] == pytest.approx(LN2)
    assert m["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-6)


def test_per_token_and_per_response_contributions_differ_with_lengths():
    """Two responses, 1 and 3 tokens, distillation terms [2] and [0, 0, -4]: per token (2 + 4)/4 = 1.5; per
    response (2/1 + 4/3)/2 = 5/3; the reverse KL estimate -(2 - 4)/4 = 0.5."""
    d = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, -4.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    _, m = mixed_advantages(torch.zeros(2), d, mask, coef=1.0)
    assert m["distill/distill_term_abs_per_token"] == pytest.approx(1.5)
    assert m["distill/distill_term_abs_per_response"] == pytest.approx(5 / 3)
    assert m["distill/reverse_kl"] == pytest.approx(0.5)


def test_a_nan_teacher_log_prob_ends_that_tokens_contribution_and_is_counted():
    teacher = TEACHER.clone()
    teacher[0, 1] = float("nan")
    teacher[0, 2] = float("nan")  # padding: not counted
    d = distill_advantages(teacher, STUDENT, MASK)
    assert d.nonfinite == 1
    assert torch.allclose(d.advantages, torch.tensor([[LN2, 0.0, 0.0]]), atol=1e-6)


def test_shapes_and_discount_are_checked():
    with pytest.raises(ValueError, match="one \\[B, T\\] shape"):
        distill_advantages(TEACHER[:, :2], STUDENT, MASK)
    with pytest.raises(ValueError, match="discount=1.5"):
        distill_advantages(TEACHER, STUDENT, MASK, discount=1.5)
