"""`collect`'s rank bookkeeping, worked by hand: which groups each rank samples in a round, and when the step's
mini-batch order is drawn before sampling."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from rlcompare.train.collect import group_order, round_shares
from rlcompare.train.parallel import World


def _cfg(*, n=4, G=2, updates=2, dynamic=False):
    return OmegaConf.create(
        {
            "trainer": {"prompts_per_step": n, "group_size": G, "updates_per_rollout": updates},
            "algorithm": {"dynamic_sampling": {"enabled": dynamic}},
        }
    )


def test_the_group_order_is_drawn_before_sampling_only_when_the_batch_is_sure_to_be_whole_groups():
    gen = torch.Generator().manual_seed(0)
    assert sorted(group_order(_cfg(), gen).tolist()) == [0, 1, 2, 3]  # a permutation of the 4 groups
    assert group_order(_cfg(dynamic=True), gen) is None  # dynamic sampling: the batch is known only after
    assert group_order(_cfg(G=1), gen) is None  # single completions: mini-batches of rows
    assert group_order(_cfg(n=2, updates=3), gen) is None  # fewer groups than steps: rows


def test_a_first_round_gives_each_rank_the_groups_it_trains_on():
    # order 3 0 2 1 in 2 mini-batches: (3 0) and (2 1); each rank takes its block of each: rank 0 groups 3 and 2,
    # rank 1 groups 0 and 1
    order = torch.tensor([3, 0, 2, 1])
    assert round_shares(World(rank=0, size=2), 4, 0, order, 2) == ([[3, 2], [0, 1]], True)


def test_later_rounds_and_single_processes_take_contiguous_shares():
    order = torch.tensor([3, 0, 2, 1])
    assert round_shares(World(rank=1, size=2), 4, 1, order, 2) == ([[0, 1], [2, 3]], False)  # a refill round
    assert round_shares(World(rank=0, size=2), 3, 0, order, 2) == ([[0, 1], [2]], False)  # order of another size
    assert round_shares(World(rank=0, size=2), 4, 0, None, 2) == ([[0, 1], [2, 3]], False)  # no order drawn
    assert round_shares(World(), 4, 0, order, 2) == ([[0, 1, 2, 3]], False)  # one process samples everything
