"""Environments stepped in the reward worker pool (#51): replayed from their seed and turns, under the verifier's
time and memory limits; a crashing, hanging, dying or lying environment answers an error with its reason."""

from __future__ import annotations

import pytest

from rlcompare.data.types import Example
from rlcompare.envs import runner
from rlcompare.rollout import episodes

EX = Example("1+0=", "1")


def _session(name, n=1, seeds=None):
    replay = runner.EnvReplay({"name": "custom", "target": f"tests.envs.hostile_envs:{name}"}, workers=1)
    return replay, runner.EnvSession(replay, [EX] * n, seeds or [7] * n, timeout_s=0.5, batch_timeout_s=5.0)


def test_a_session_replays_each_episode_from_its_seed_and_turns():
    replay, s = _session("Counting", n=2, seeds=[3, 4])
    try:
        assert [r.observation for r in s.reset()] == ["s3\n", "s4\n"]
        first = s.step([0, 1], ["1", "0"])
        assert [(r.observation, r.reward, r.done) for r in first] == [("t1\n", 1.0, False), ("t1\n", 0.0, False)]
        second = s.step([0], ["0"])  # the worker rebuilt episode 0: reset, then both turns
        assert (second[0].observation, second[0].done, second[0].info) == ("t2\n", True, {"correct": False})
    finally:
        replay.close()


@pytest.mark.parametrize(
    "name, reason",
    [
        ("Crashing", "raised"),
        ("Hanging", "timeout"),
        ("NanReward", "nan_reward"),
        ("Huge", "huge_observation"),
        ("Dying", "worker_lost"),
    ],
)
def test_a_misbehaving_environment_answers_an_error_naming_why(name, reason):
    replay, s = _session(name)
    try:
        s.reset()
        (res,) = s.step([0], ["1"])
        assert res.done and res.info == {"error": reason}
        # and the rollout ends the episode with that reason
        e = episodes._Episode()
        episodes._answer(None, e, res, 0, episodes.EpisodeSettings(3, 40, 8))
        assert e.end == reason and e.reward == 0.0
    finally:
        replay.close()


def test_a_workers_reply_carries_the_environments_metrics_and_refuses_ones_the_row_cannot_hold():
    from rlcompare.envs.base import StepResult
    from rlcompare.rewards.pool import Score

    def through(info):  # what the trainer's process reads of a worker's reply
        reply = runner._reply_of(StepResult("no", 0.0, False, info))
        return reply if reply in runner.REPLY_ERRORS else runner._step_result(Score(0.0, False, False, reply))

    got = through({"correct": False, "metrics": {"tries": 2, "share": 0.25}})
    assert got.info == {"correct": False, "metrics": {"tries": 2.0, "share": 0.25}}
    assert through({}).info == {}  # no metrics: none sent
    assert through({"metrics": {"tries": float("nan")}}) == "bad_reply"
    assert through({"metrics": {"x" * 65: 1}}) == "bad_reply"  # no name that long is declarable
    assert through({"metrics": {f"m{i}": 1 for i in range(65)}}) == "bad_reply"  # a runaway dict
    assert through({"metrics": [("tries", 2)]}) == "bad_reply"
    # a reply whose metrics were tampered with on the way is refused on the trainer's side too
    tampered = '{"observation": "no", "reward": 0.0, "done": false, "correct": null, "metrics": {"t": "2"}}'
    assert runner._step_result(Score(0.0, False, False, tampered)).info == {"error": "bad_reply"}
