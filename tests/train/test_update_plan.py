"""`update.plan_update`: how one update walks the batch, decided without a model. Every expectation below is
worked by hand from the rules: mini-batches of whole groups when there are at least as many groups as
optimizer steps (else rows), micro-batches rounded to whole groups, the idle rows of
`trainer.skip_zero_advantage` in whole groups, and fsdp's count of micro-batches every rank runs."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlcompare.rollout import Completions
from rlcompare.train.batch import RolloutBatch, Targets
from rlcompare.train.parallel import World
from rlcompare.train.update import plan_update


def _cfg(*, G=2, updates=1, micro=None, skip=False, aggregation="seq-mean-token-mean", **algo):
    return OmegaConf.create(
        {
            "trainer": {
                "group_size": G,
                "updates_per_rollout": updates,
                "micro_batch_size": micro,
                "skip_zero_advantage": skip,
            },
            "algorithm": {
                "aggregation": aggregation,
                "surrogate": algo.get("surrogate", "clip"),
                "top_entropy_quantile": algo.get("top_entropy_quantile"),
                "entropy_coef": algo.get("entropy_coef", 0.0),
                "kl": {"coef": algo.get("kl_coef", 0.0)},
                "advantage": {"estimator": algo.get("estimator", "group")},
            },
        }
    )


def _batch(lengths: list[int], T: int = 4) -> tuple[RolloutBatch, torch.Tensor]:
    """A batch whose row i has `lengths[i]` real completion tokens; returns it and its (B, T) mask."""
    B = len(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    comp = Completions(torch.ones(B, T, dtype=torch.long), mask, None, torch.zeros(B, dtype=torch.bool), mask.sum(1))
    prompt = torch.ones(B, 1, dtype=torch.long)
    zeros = torch.zeros(B)
    return RolloutBatch(prompt, prompt, comp, zeros, zeros, zeros.bool(), [None] * B), mask


def _targets(mask, advantages) -> Targets:
    return Targets(loss_mask=mask, advantages=torch.tensor(advantages, dtype=torch.float32))


def _rows(step) -> list[int]:
    return step.rows.tolist()


def test_whole_groups_in_the_drawn_order_when_there_are_enough_groups():
    # 4 groups of 2, two optimizer steps, groups drawn in the order 2, 0, 3, 1: the first step holds groups 2 and 0
    # (rows 4 5 0 1), the second groups 3 and 1 (rows 6 7 2 3); no micro-batches: each step one forward
    batch, mask = _batch([4, 3, 2, 1, 4, 4, 1, 1])
    plan = plan_update(
        batch, _targets(mask, [1.0] * 8), _cfg(G=2, updates=2), World(), order=torch.tensor([2, 0, 3, 1])
    )
    assert plan.grouped
    assert [_rows(s) for s in plan.steps] == [[4, 5, 0, 1], [6, 7, 2, 3]]
    assert [[m.tolist() for m in s.micro] for s in plan.steps] == [[[4, 5, 0, 1]], [[6, 7, 2, 3]]]
    assert [s.n_micro for s in plan.steps] == [1, 1]
    assert plan.total_tokens == 4 + 3 + 2 + 1 + 4 + 4 + 1 + 1  # 20, the whole batch's: every step's normalizer
    assert plan.idle is None and plan.n_idle == 0 and plan.group_tokens is None


def test_rows_not_groups_when_there_are_fewer_groups_than_steps():
    # 3 groups of 2 and 4 optimizer steps: 3 < 4, so the 6 rows are shuffled one by one and cut 2, 2, 1, 1
    batch, mask = _batch([1] * 6)
    gen = torch.Generator().manual_seed(5)
    plan = plan_update(batch, _targets(mask, [1.0] * 6), _cfg(G=2, updates=4), World(), generator=gen)
    assert not plan.grouped
    assert [len(s.rows) for s in plan.steps] == [2, 2, 1, 1]
    assert sorted(sum((_rows(s) for s in plan.steps), [])) == [0, 1, 2, 3, 4, 5]  # each row once
    # G = 1 is never grouped, however many rows
    batch, mask = _batch([1] * 4)
    assert not plan_update(batch, _targets(mask, [1.0] * 4), _cfg(G=1, updates=2), World(), generator=gen).grouped


def test_a_drawn_order_of_the_wrong_length_is_not_used():
    # a drawn order covers the step's groups only when the batch is whole groups of it; otherwise the plan draws
    batch, mask = _batch([1] * 4)  # 2 groups of 2
    gen = torch.Generator().manual_seed(0)
    plan = plan_update(
        batch, _targets(mask, [1.0] * 4), _cfg(G=2), World(), order=torch.tensor([2, 0, 1]), generator=gen
    )
    assert plan.grouped and sorted(_rows(plan.steps[0])) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "micro, grouped_rows",
    [
        (6, 4),  # 6 rows hold one whole group of 4: micro-batches of 4
        (9, 8),  # two whole groups
        (2, 4),  # fewer than a group: still one whole group
    ],
)
def test_micro_batches_are_rounded_down_to_whole_groups_but_never_below_one(micro, grouped_rows):
    batch, mask = _batch([2] * 8)  # 2 groups of 4, one step: rows 0-7 in the order 1, 0
    plan = plan_update(batch, _targets(mask, [1.0] * 8), _cfg(G=4, micro=micro), World(), order=torch.tensor([1, 0]))
    assert plan.micro_rows == grouped_rows
    want = [4, 5, 6, 7, 0, 1, 2, 3]
    assert [m.tolist() for m in plan.steps[0].micro] == [want[i : i + grouped_rows] for i in range(0, 8, grouped_rows)]


def test_row_micro_batches_keep_the_configured_size():
    batch, mask = _batch([1] * 4)  # 2 groups of 2, 3 steps: rows, micro-batches of 3 rows as asked
    plan = plan_update(
        batch, _targets(mask, [1.0] * 4), _cfg(G=2, updates=3, micro=3), World(), generator=torch.Generator()
    )
    assert not plan.grouped and plan.micro_rows == 3


def test_idle_rows_are_whole_groups_whose_advantages_are_all_zero():
    # groups (0 1) (2 3) (4 5): advantages 0 0 | 0 0.5 | 0 0. Group 1 has a nonzero row, so all of it computes;
    # groups 0 and 2 are idle: 4 rows, counted with objective 0, never run
    batch, mask = _batch([3, 1, 2, 2, 4, 1])
    plan = plan_update(
        batch,
        _targets(mask, [0.0, 0.0, 0.0, 0.5, 0.0, 0.0]),
        _cfg(G=2, skip=True),
        World(),
        order=torch.tensor([0, 1, 2]),
    )
    assert plan.idle.tolist() == [True, True, False, False, True, True]
    assert plan.n_idle == 4
    step = plan.steps[0]
    assert step.mine.tolist() == [2, 3] and step.idle.tolist() == [0, 1, 4, 5]
    assert [m.tolist() for m in step.micro] == [[2, 3]] and step.n_micro == 1
    assert plan.total_tokens == 13  # idle rows' tokens still in the normalizer: 3+1+2+2+4+1


def test_idle_rows_one_by_one_when_the_plan_is_rows():
    # 2 groups, 3 steps: rows, so an idle row is any row with zero advantage (rows 0, 2, 3)
    batch, mask = _batch([1] * 4)
    plan = plan_update(
        batch,
        _targets(mask, [0.0, 0.5, 0.0, 0.0]),
        _cfg(G=2, updates=3, skip=True),
        World(),
        generator=torch.Generator(),
    )
    assert plan.idle.tolist() == [True, False, True, True] and plan.n_idle == 3
    assert sum(len(s.mine) for s in plan.steps) == 1  # row 1 alone computes


def test_idle_rows_per_token_advantages_are_zero_on_every_token():
    batch, mask = _batch([2, 2])
    adv = [[0.0, 0.0, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0]]  # (B, T) per token: row 1 has one nonzero token
    plan = plan_update(batch, _targets(mask, adv), _cfg(G=1, skip=True), World(), generator=torch.Generator())
    assert plan.idle.tolist() == [True, False]


@pytest.mark.parametrize(
    "algo",
    [
        {"kl_coef": 0.04},  # a KL term in the loss: every row counts
        {"entropy_coef": 0.01},  # an entropy bonus
        {"estimator": "gae"},  # a critic
        {"top_entropy_quantile": 0.8},  # a threshold over all of a step's tokens
        {"surrogate": "clip-cov"},  # a covariance over all of a step's tokens
    ],
)
def test_no_idle_rows_where_skipping_them_would_change_the_update(algo):
    batch, mask = _batch([1] * 4)
    plan = plan_update(
        batch, _targets(mask, [0.0] * 4), _cfg(G=2, skip=True, **algo), World(), order=torch.tensor([0, 1])
    )
    assert plan.idle is None and plan.n_idle == 0 and len(plan.steps[0].mine) == 4


def test_ranks_take_contiguous_shares_of_each_step_in_whole_groups():
    # 3 groups of 2 over 2 ranks: rank 0 takes the step's first two groups, rank 1 the third (sizes differ by 1)
    batch, mask = _batch([1] * 6)
    cfg = _cfg(G=2)
    order = torch.tensor([2, 0, 1])  # rows 4 5 0 1 2 3
    p0 = plan_update(batch, _targets(mask, [1.0] * 6), cfg, World(rank=0, size=2, mode="ddp"), order=order)
    p1 = plan_update(batch, _targets(mask, [1.0] * 6), cfg, World(rank=1, size=2, mode="ddp"), order=order)
    assert p0.steps[0].mine.tolist() == [4, 5, 0, 1] and p0.steps[0].share == slice(0, 4)
    assert p1.steps[0].mine.tolist() == [2, 3] and p1.steps[0].share == slice(4, 6)


def test_fsdp_pads_every_rank_to_the_most_micro_batches_of_any_rank():
    # 3 groups of 2, micro-batches of one group: rank 0 holds 2 groups (2 micro-batches), rank 1 one group (1).
    # Under fsdp both run 2 (rank 1 pads one zero-weight forward); under ddp each runs its own.
    batch, mask = _batch([1] * 6)
    t = _targets(mask, [1.0] * 6)
    cfg, order = _cfg(G=2, micro=2), torch.tensor([0, 1, 2])
    fsdp = [plan_update(batch, t, cfg, World(rank=r, size=2, mode="fsdp"), order=order).steps[0] for r in (0, 1)]
    assert [len(s.micro) for s in fsdp] == [2, 1] and [s.n_micro for s in fsdp] == [2, 2]
    ddp = [plan_update(batch, t, cfg, World(rank=r, size=2, mode="ddp"), order=order).steps[0] for r in (0, 1)]
    assert [s.n_micro for s in ddp] == [2, 1]
    # rank 0's groups 0 and 1 idle (advantages 0), rank 1's group 2 not: rank 0 computes nothing but runs the
    # one micro-batch rank 1 runs
    idle = _targets(mask, [0.0, 0.0, 0.0, 0.0, 1.0, -1.0])
    cfg = _cfg(G=2, micro=2, skip=True)
    fsdp = [plan_update(batch, idle, cfg, World(rank=r, size=2, mode="fsdp"), order=order).steps[0] for r in (0, 1)]
    assert [len(s.micro) for s in fsdp] == [0, 1] and [s.n_micro for s in fsdp] == [1, 1]
    assert fsdp[0].idle.tolist() == [0, 1, 2, 3]


def test_prompt_mean_token_mean_gets_each_rows_group_token_count():
    # groups (3 + 1) and (2 + 2): each row's group count, computed on the whole batch
    batch, mask = _batch([3, 1, 2, 2])
    plan = plan_update(
        batch,
        _targets(mask, [1.0] * 4),
        _cfg(G=2, aggregation="prompt-mean-token-mean"),
        World(),
        order=torch.tensor([0, 1]),
    )
    assert plan.group_tokens.tolist() == [4, 4, 4, 4]
    batch, mask = _batch([3, 1, 1, 1])
    plan = plan_update(
        batch,
        _targets(mask, [1.0] * 4),
        _cfg(G=2, aggregation="prompt-mean-token-mean"),
        World(),
        order=torch.tensor([0, 1]),
    )
    assert plan.group_tokens.tolist() == [4, 4, 2, 2]
