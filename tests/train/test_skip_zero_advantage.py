"""trainer.skip_zero_advantage: groups whose advantages are all 0 get no forward/backward, and the update is
the same as without the skip (their loss is exactly 0; AdamW still steps on a mini-batch left empty)."""

from __future__ import annotations

import pytest
import torch

from rlcompare.config import validate
from rlcompare.train.trainer import Trainer

# 4 groups of 4, two mini-batches of 2 groups: with 3 flat groups one mini-batch is always left empty. The rows
# are counted at the model's forward, which the first mini-batch skips when it reuses the rollout's projections
# (tests/fast/test_recorded_update.py): off here.
COMMON = ["algorithm=drgrpo", "trainer.updates_per_rollout=2", "trainer.lr=1e-3", "trainer.update_from_rollout=false"]


def _update(compose, tmp_path, name: str, *extra: str):
    tr = Trainer(validate(compose(*COMMON, *extra)), tmp_path / name)
    b = tr.collect().batch
    # Rewards set by hand: groups 0, 1, 3 flat (all 1, all 0, all 1), group 2 mixed
    b.rewards = torch.tensor([1.0] * 4 + [0.0] * 4 + [0.0, 1.0, 0.0, 1.0] + [1.0] * 4)
    before = [p.detach().clone() for p in tr.policy.model.parameters()]
    grads = []  # every parameter's gradient at each optimizer step
    step = tr.opt.step

    def recording_step(*a, **kw):
        grads.append([None if p.grad is None else p.grad.detach().clone() for p in tr.params])
        return step(*a, **kw)

    tr.opt.step = recording_step
    rows = []
    hook = tr.policy.model.model.register_forward_pre_hook(
        lambda mod, args, kw: rows.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    up = tr.update(b, tr.targets.advantages(b), b.completions.logp)
    hook.remove()
    assert any(not torch.equal(p, q) for p, q in zip(tr.policy.model.parameters(), before))  # the update moved it
    return tr, b, up, rows, grads


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_skipping_flat_groups_gives_the_same_update(compose, tmp_path):
    ref, b_ref, up_ref, rows_ref, g_ref = _update(compose, tmp_path, "full")
    fast, b_fast, up_fast, rows_fast, g_fast = _update(compose, tmp_path, "skip", "trainer.skip_zero_advantage=true")
    assert torch.equal(b_ref.completions.ids, b_fast.completions.ids)  # same seed, same batch
    # only the mixed group's prompt (1 row) and its 4 completions went through the model, not all 4 groups
    assert sum(rows_ref) == 4 + 16 and sum(rows_fast) == 1 + 4
    assert up_ref.idle_rows_frac == 0.0 and up_fast.idle_rows_frac == 0.75
    # the same gradient at both optimizer steps, one of them all zeros (the mini-batch of flat groups: AdamW still
    # steps). Parameters are not compared: Adam's first step is about lr * sign(g), so float noise in a
    # gradient element that is ~0 flips it (the forward ran on 1 group instead of 2, a 1e-7 difference).
    assert len(g_ref) == len(g_fast) == 2
    assert any(all(float(g.abs().max()) == 0.0 for g in step) for step in g_fast)
    for step_ref, step_fast in zip(g_ref, g_fast):
        scale = max(float(g.abs().max()) for g in step_ref)
        for g, h in zip(step_ref, step_fast):
            assert h is not None  # a None gradient would make AdamW skip the parameter: not the same update
            torch.testing.assert_close(h, g, atol=1e-5 * scale + 1e-12, rtol=0)
    assert abs(up_fast.metrics["loss/policy"] - up_ref.metrics["loss/policy"]) < 1e-7
    assert (
        abs(up_fast.metrics["objective_per_token"] - up_ref.metrics["objective_per_token"]) < 1e-7
    )  # idle tokens counted as 0


def test_nothing_is_skipped_when_every_row_counts(compose, tmp_path):
    # a KL term in the loss (GRPO's beta > 0) gives zero-advantage rows a gradient: no skipping
    _, _, up, rows, _ = _update(
        compose,
        tmp_path,
        "kl",
        "trainer.skip_zero_advantage=true",
        "algorithm.kl.coef=0.01",
        "algorithm.kl.placement=in_loss",
    )
    assert up.idle_rows_frac == 0.0 and sum(rows) >= 4 + 16
