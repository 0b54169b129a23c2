"""The verifier's declared metrics ride with the rollout batch (#64): dynamic sampling's selection and joined
rounds keep each row's values, and a queued rollout (rollout.staleness) keeps them through a checkpoint, where a
malformed table is refused."""

from __future__ import annotations

import math

import pytest
import torch

from rlcompare.rollout import Completions
from rlcompare.train.batch import Collected, RolloutBatch
from rlcompare.train.stale_queue import Queued, StaleQueue

G = 2


def _batch(metrics: torch.Tensor, prompts: list) -> RolloutBatch:
    B = len(metrics)
    c = Completions(
        torch.ones(B, 3, dtype=torch.long),
        torch.ones(B, 3, dtype=torch.long),
        None,
        torch.zeros(B, dtype=torch.bool),
        torch.full((B,), 3, dtype=torch.long),
    )
    ids = torch.ones(B, 2, dtype=torch.long)
    r = torch.zeros(B)
    return RolloutBatch(ids, ids.clone(), c, r, r.clone(), torch.zeros(B, dtype=torch.bool), prompts, None, metrics)


def test_selection_and_joined_rounds_keep_each_rows_metrics():
    m = torch.tensor([[1.0, math.nan], [2.0, 0.5], [3.0, math.nan], [4.0, 1.5]])
    b = _batch(m, ["p0", "p1"])
    kept = b.select(torch.tensor([False, False, True, True]), G)  # the second group
    assert torch.allclose(kept.verifier_metrics, m[2:], equal_nan=True)
    both = RolloutBatch.concat([kept, b.select(torch.tensor([True, True, False, False]), G)], pad_id=0)
    assert torch.allclose(both.verifier_metrics, torch.cat([m[2:], m[:2]]), equal_nan=True)


def test_a_queued_rollout_keeps_its_metrics_and_a_malformed_table_is_refused():
    prompts = ["p0", "p1"]
    m = torch.tensor([[1.0], [math.nan], [3.0], [4.0]])
    q = StaleQueue(1)
    q.push(Queued(Collected(_batch(m, prompts), 1, 2, 0, 12, 0.1, 0.2), 1, None))
    saved = q.state(prompts)
    back = StaleQueue(1)
    back.load(saved, prompts, G, "cpu")
    assert torch.allclose(back.pending[0].collected.batch.verifier_metrics, m, equal_nan=True)
    saved[0]["batch"]["verifier_metrics"] = m[:3]  # a row short
    with pytest.raises(ValueError, match="verifier metrics"):
        StaleQueue(1).load(saved, prompts, G, "cpu")
