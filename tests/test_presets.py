"""Each preset file matches its row of algorithms.md §6 (values transcribed from that table, not from the files)."""

from __future__ import annotations

import pytest

from rlcompare.config import validate

# algorithms.md §6, one dict per column: knob -> expected value.
TABLE = {
    "ppo": dict(estimator="gae", scale="whiten", ratio="token", eps=(0.2, 0.2), aggregation="token-mean",
                kl=("k1", "in_reward", True), dynamic=False, soft_overlong=False),
    "grpo": dict(estimator="group", scale="group", ratio="token", eps=(0.2, 0.2), aggregation="seq-mean-token-mean",
                 kl=("k3", "in_loss", True), dynamic=False, soft_overlong=False),
    "drgrpo": dict(estimator="group", scale="none", ratio="token", eps=(0.2, 0.2), aggregation="seq-mean-token-sum-norm",
                   kl=(None, None, False), dynamic=False, soft_overlong=False),
    "dapo": dict(estimator="group", scale="group", ratio="token", eps=(0.2, 0.28), aggregation="token-mean",
                 kl=(None, None, False), dynamic=True, soft_overlong=True),
    "gspo": dict(estimator="group", scale="group", ratio="sequence", eps=(3e-4, 4e-4), aggregation="seq-mean-token-mean",
                 kl=(None, None, False), dynamic=False, soft_overlong=False),
    "dhpo": dict(estimator="group", scale="group", ratio="hybrid", eps=(0.2, 0.28), seq_eps=(3e-4, 4e-4),
                 aggregation="token-mean", kl=(None, None, False), dynamic=False, soft_overlong=False),
    # RLOO: leave-one-out advantages, otherwise GRPO's settings
    "rloo": dict(estimator="rloo", scale="none", ratio="token", eps=(0.2, 0.2), aggregation="seq-mean-token-mean",
                 kl=("k3", "in_loss", True), dynamic=False, soft_overlong=False),
}


@pytest.mark.parametrize("preset", sorted(TABLE))
def test_preset_matches_algorithms_md(compose, preset):
    row = TABLE[preset]
    a = validate(compose(f"algorithm={preset}", fast=False)).algorithm
    assert a.name == preset
    assert a.advantage.estimator == row["estimator"] and a.advantage.scale == row["scale"]
    assert a.ratio == row["ratio"]
    assert (a.clip.eps_low, a.clip.eps_high) == pytest.approx(row["eps"])
    if "seq_eps" in row:
        assert (a.clip.seq_eps_low, a.clip.seq_eps_high) == pytest.approx(row["seq_eps"])
        assert a.clip.mix == "mean"
    assert a.aggregation == row["aggregation"]
    estimator, placement, on = row["kl"]
    assert (a.kl.coef > 0) == on
    if on:
        assert (a.kl.estimator, a.kl.placement) == (estimator, placement)
    assert a.dynamic_sampling.enabled == row["dynamic"]
    assert a.overlong.soft_punishment == row["soft_overlong"]
    assert a.clip.dual_clip is None


def test_drgrpo_horizon_is_the_generation_budget_not_the_batch_width(compose):
    a = validate(compose("algorithm=drgrpo", "budget.max_new_tokens=7", fast=False)).algorithm
    assert a.horizon == 7


def test_grpo_std_uses_sample_std(compose):
    assert validate(compose("algorithm=grpo", fast=False)).algorithm.advantage.std_ddof == 1
