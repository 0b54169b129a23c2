"""`GroupStreams.uniform_`: the draws of `uniform`, written into a buffer the caller keeps (the graph engine's)."""

from __future__ import annotations

import pytest
import torch

from rlcompare.rollout.streams import GroupStreams


def _streams() -> GroupStreams:
    return GroupStreams([(7, 0), (7, 1), (7, 2)], 2, "cpu")


def test_uniform_in_place_draws_the_same_bits_as_uniform_position_after_position():
    fresh, in_place = _streams(), _streams()
    out = torch.full((6, 11), -1.0)
    address = out.data_ptr()
    for _ in range(4):  # each position advances every group's generator the same way in both
        want = fresh.uniform(11)
        assert in_place.uniform_(out) is out and out.data_ptr() == address
        assert torch.equal(out, want)
    # rows 2-3 are group 1's: a stream of its own, seeded from its key alone
    alone = GroupStreams([(7, 1)], 2, "cpu")
    for _ in range(4):
        last = alone.uniform(11)
    assert torch.equal(out[2:4], last)
    assert bool((out >= 0).all()) and bool((out < 1).all())


def test_uniform_in_place_refuses_a_buffer_of_other_rows_or_a_strided_one():
    with pytest.raises(ValueError, match=r"contiguous \[6, vocab\] tensor, got \(5, 11\)"):
        _streams().uniform_(torch.empty(5, 11))
    with pytest.raises(ValueError, match="contiguous"):
        _streams().uniform_(torch.empty(11, 6).t())
