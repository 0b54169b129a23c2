"""The weighted verifier's named reward components (Score.components, what the gdpo estimator reads): each
component's own reward, before its weight, in the config's order, the same inline and through a worker process."""

from __future__ import annotations

import math

from rlcompare.rewards import pool
from rlcompare.rewards.registry import build_one


def _weighted(isolation: str):
    return build_one(
        {
            "name": "weighted",
            "isolation": isolation,
            "components": [{"name": "exact_match", "weight": 1.0}, {"name": "format", "weight": 0.5}],
            "pattern": "done",
        }
    )


def test_components_are_each_rewards_in_order_and_the_reward_their_weighted_sum():
    v = _weighted("inline")
    s = v.score("the answer is 7 done", "7")
    assert s.components == (1.0, 1.0) and s.reward == 1.5 and s.correct
    s = v.score("the answer is 8", "7")
    assert s.components == (0.0, 0.0) and s.reward == 0.0


def test_components_travel_through_a_worker_process():
    texts, answers = ["7 done", "8 done", "7"], ["7", "7", "7"]
    inline = pool.score_batch(_weighted("inline"), texts, answers, timeout_s=5.0)
    worker = pool.score_batch(_weighted("process"), texts, answers, timeout_s=5.0)
    assert [s.components for s in worker] == [s.components for s in inline] == [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0)]


def test_a_reply_with_bad_components_is_not_a_score():
    assert pool._is_score_reply([3, 1.0, True, False, "", [1.0, 0.5]], 3)
    assert not pool._is_score_reply([3, 1.0, True, False, "", [math.nan]], 3)
    assert not pool._is_score_reply([3, 1.0, True, False, "", ["1"]], 3)
    assert not pool._is_score_reply([3, 1.0, True, False, "", 1.0], 3)
