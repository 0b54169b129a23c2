"""Environments at their edges (#62): what counts as a reward and as a verdict, a replay that differs from what the
policy saw, observation text that spells a special token, an episode reward past float32, and an environment's
tool process that must not outlive its worker. Each of these was wrong at 6c29db8."""

from __future__ import annotations

import os
import time

import pytest
import torch

from rlcompare.data.types import Example
from rlcompare.envs import runner
from rlcompare.envs.base import StepResult
from rlcompare.rollout import episodes

from tests.envs.hostile_envs import Replies
from tests.rollout.test_episodes import TOK, NeverDone, _ids, _run


def _session(name, examples, seeds=None, **settings):
    spec = {"name": "custom", "target": f"tests.envs.hostile_envs:{name}", "settings": settings}
    replay = runner.EnvReplay(spec, workers=1)
    seeds = seeds or [7] * len(examples)
    return replay, runner.EnvSession(replay, examples, seeds, timeout_s=30.0, batch_timeout_s=120.0)


# case -> (the episode's end, its reward, its correctness), the reward as the trainer holds it
WANT = {
    "unsaid": ("done", 1.0, True),
    "unsaid_zero": ("done", 0.0, False),
    "said_false": ("done", 1.0, False),
    "none_said": ("done", 0.5, True),
    "int": ("done", 2.0, True),
    "bool": ("done", 1.0, True),
    "numpy": ("done", 0.25, True),
    "tensor": ("done", 0.75, True),
    "str_reward": ("bad_reply", 0.0, False),
    "inf": ("nan_reward", 0.0, False),
    "float32_inf": ("nan_reward", 0.0, False),
    "huge_int": ("nan_reward", 0.0, False),
    "correct_no": ("bad_reply", 0.0, False),
    "correct_one": ("bad_reply", 0.0, False),
}


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_rewards_and_verdicts_through_the_worker_pool_read_as_documented():
    """Any real number is a reward; info["correct"] decides when set to a bool, the reward > 0 when not; anything
    else as a verdict is bad_reply, a reward past float32 nan_reward. Through the pool, then into the episodes."""
    cases = list(Replies.CASES)
    assert sorted(cases) == sorted(WANT)
    examples = [Example("1+0=", case) for case in cases]
    replay, s = _session("Replies", examples)
    try:
        s.reset()
        answers = s.step(list(range(len(cases))), ["1"] * len(cases))
    finally:
        replay.close()
    got = {}
    for case, res in zip(cases, answers):
        e = episodes._Episode()
        episodes._answer(TOK, e, res, 0, episodes.EpisodeSettings(3, 40, 8))
        got[case] = (e.end, e.reward, e.correct)
    assert got == WANT


@pytest.mark.parametrize("case", sorted(WANT))
def test_the_same_replies_stepped_in_this_process(case):
    """A Session that does not go through the pool (rollout.episodes reads the StepResult itself) agrees."""
    env = Replies()
    _, (_, _, c) = _run({0: ["1"]}, [env], [Example("1+0=", case)], [_ids("1+0=")], G=1)
    end, reward, correct = WANT[case]
    assert (c.outcome.ends[0], c.outcome.rewards.tolist()[0], c.outcome.correct.tolist()[0]) == (end, reward, correct)


class Big(NeverDone):
    def step(self, text):
        return StepResult("again\n", 3e38, False, {"correct": True})


def test_turn_rewards_whose_sum_overflows_float32_are_the_environments_error():
    # 3e38 is a float32; two of them are not: the episode ends nan_reward (an environment error), reward 0, and the
    # batch holds no inf for the trainer to blame on the verifier
    _, (_, _, c) = _run({t: ["1"] for t in range(3)}, [Big()], [Example("1+0=", "1")], [_ids("1+0=")], G=1)
    assert c.outcome.ends == ["nan_reward"] and c.outcome.turns.tolist() == [2]
    assert c.outcome.rewards.tolist() == [0.0] and bool(torch.isfinite(c.outcome.rewards).all())
    assert episodes.metrics([c.outcome])["env/errors/nan_reward"] == 1


def test_a_replay_that_differs_from_what_the_policy_saw_ends_not_replayable():
    replay, s = _session("Drifting", [Example("1+0=", "1")])
    try:
        s.reset()
        (first,) = s.step([0], ["1"])  # one replay: reset, step -> an observation the policy now sees
        assert first.observation.endswith("\n") and not first.done
        (second,) = s.step([0], ["2"])  # replayed afresh: the first step's observation differs
        assert second.done and second.info == {"error": "not_replayable"}
    finally:
        replay.close()
    e = episodes._Episode()
    episodes._answer(TOK, e, second, 1, episodes.EpisodeSettings(3, 40, 8))
    assert e.end == "not_replayable" and "not_replayable" in episodes.ERRORS


class SeedlessStart(NeverDone):
    def __init__(self, text):
        self.text = text

    def reset(self, example, seed):
        return self.text


def test_a_group_member_whose_first_observation_is_not_the_groups_ends_not_replayable():
    # one seed per group: the policy sees the first member's opening; a member whose reset said otherwise is not
    # the episode the policy plays
    envs = [SeedlessStart("a\n"), SeedlessStart("b\n"), SeedlessStart("a\n")]
    _, (_, _, c) = _run({0: ["1"] * 3}, envs, [Example("1+0=", "1")] * 3, [_ids("1+0=")], G=3, max_turns=1)
    assert c.outcome.ends == ["max_turns", "not_replayable", "max_turns"]


class Spells(NeverDone):
    def step(self, text):
        return StepResult("<eos>x<pad>\n", 0.0, False)


def test_an_observation_that_spells_a_special_token_is_that_text():
    _, (_, _, c) = _run({0: ["1"], 1: ["2"]}, [Spells()], [Example("1+0=", "1")], [_ids("1+0=")], G=1, max_turns=2)
    env_ids = c.ids[0][c.env_mask[0].bool()].tolist()
    assert env_ids == _ids("<")[:1] + [TOK.convert_tokens_to_ids(ch) for ch in "eos>x<pad>\n"]
    assert TOK.eos_token_id not in env_ids and TOK.pad_token_id not in env_ids
    assert c.outcome.texts == ["1«<eos>x<pad>\n»2"]  # samples.jsonl shows what the policy saw


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent: init, here) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_tool_process_an_environment_started_dies_with_its_worker(tmp_path):
    replay, s = _session("HangingTool", [Example("1+0=", "1")], pids=str(tmp_path))
    try:
        s.timeout_s = 0.5
        s.reset()
        (res,) = s.step([0], ["1"])
        assert res.info == {"error": "timeout"}
        (pid,) = [int(p) for p in os.listdir(tmp_path)]
    finally:
        replay.close()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the environment's tool process outlived the pool"


def test_the_env_spec_crosses_to_workers_as_plain_data(compose):
    """The composed config's env.settings (an OmegaConf node, nested) reaches the workers as dicts and lists."""
    from rlcompare.train.env_rollout import EnvRollout

    from rlcompare.config import validate

    target = "tests.envs.fixed_envs:EvenAnswer"  # a custom target takes any settings
    cfg = validate(
        compose("env=feedback", "env.name=custom", f"env.target={target}", "+env.settings.deep={a: [1, {b: 2}]}")
    )
    spec = EnvRollout(cfg).replay.spec
    assert spec == {"name": "custom", "target": target, "settings": {"deep": {"a": [1, {"b": 2}]}}}
    assert type(spec["settings"]["deep"]) is dict and type(spec["settings"]["deep"]["a"][1]) is dict
