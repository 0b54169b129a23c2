"""Environments stepped in the reward worker pool, under the verifier's time and memory limits (#51).

Every `reset` and `step` runs in a worker process of `rlcompare.rewards.pool` (its public entry,
`score_batch`: a per-call deadline of `verifier.timeout_s`, a hard kill past it, an address-space cap, a batch
bound of `verifier.batch_timeout_s`). Nothing the worker sends back is unpickled (its replies are JSON), so an
environment's state never comes back either: a worker rebuilds the episode by replaying it, `reset(example,
seed)` then `step` on each policy turn so far (an environment is deterministic given its seed, as
`envs.base` asks), and answers the last step as JSON in the score's `reason`. A crash, a hang, a NaN reward
or a huge observation becomes a `StepResult` with `info["error"]` naming why; `rollout.episodes` ends the
episode with that reason.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rlcompare.data.types import Example
from rlcompare.envs import builtin
from rlcompare.envs.base import StepResult
from rlcompare.rewards.pool import Score, score_batch
from rlcompare.rewards.verifiers import Verifier

MAX_OBSERVATION_CHARS = 65_536  # a worker answers a longer observation as an error (huge_observation)


class EnvReplay(Verifier):
    """What the pool's workers hold: the environment's spec; `score("", (example, seed, turns))` replays the
    episode and answers its last step as JSON in `Score.reason` (`error` set, with the reason, when it failed)."""

    name = "env"
    bounded = False
    isolation = "process"

    def __init__(self, spec: dict, workers: int | None = None):
        self.spec = dict(spec)
        self.workers = workers

    def score(self, completion: str, job) -> Score:
        example, seed, turns = job
        try:
            env = builtin.build(self.spec)
            observation, reward, done, correct = env.reset(example, seed), 0.0, False, False
            for text in turns:
                res = env.step(text)
                observation, reward, done = res.observation, res.reward, res.done
                correct = bool(res.info.get("correct", False)) if isinstance(res.info, dict) else False
        except Exception:
            return Score(0.0, False, True, "raised")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            return Score(0.0, False, True, "nan_reward")
        if observation is not None and not isinstance(observation, str):
            return Score(0.0, False, True, "bad_reply")
        if observation is not None and len(observation) > MAX_OBSERVATION_CHARS:
            return Score(0.0, False, True, "huge_observation")
        reply = {"observation": observation, "reward": float(reward), "done": bool(done), "correct": correct}
        return Score(0.0, False, False, json.dumps(reply))


def _step_result(s: Score) -> StepResult:
    """A worker's score as the step it answered (`info["error"]`: why not, when it failed)."""
    if s.error:
        return StepResult(None, 0.0, True, {"error": s.reason or "raised"})
    try:
        d = json.loads(s.reason)
        obs, reward, done, correct = d["observation"], d["reward"], d["done"], d["correct"]
        ok = (obs is None or isinstance(obs, str)) and isinstance(done, bool) and isinstance(correct, bool)
        if ok and isinstance(reward, (int, float)) and not isinstance(reward, bool):
            return StepResult(obs, float(reward), done, {"correct": correct})
    except Exception:
        pass
    return StepResult(None, 0.0, True, {"error": "bad_reply"})


class EnvSession:
    """The environments of one batch of episodes (`rollout.episodes.Session`), one per row, each remembered as
    (example, seed, its policy turns so far) and stepped in the pool."""

    def __init__(self, replay: EnvReplay, examples: list[Example], seeds: list[int], *, timeout_s, batch_timeout_s):
        self.replay, self.examples, self.seeds = replay, list(examples), [int(s) for s in seeds]
        self.turns: list[list[str]] = [[] for _ in self.examples]
        self.timeout_s, self.batch_timeout_s = timeout_s, batch_timeout_s

    def _run(self, rows: list[int]) -> list[StepResult]:
        jobs = [(self.examples[r], self.seeds[r], list(self.turns[r])) for r in rows]
        scores = score_batch(
            self.replay, [""] * len(jobs), jobs, timeout_s=self.timeout_s, batch_timeout_s=self.batch_timeout_s
        )
        return [_step_result(s) for s in scores]

    def reset(self) -> list[StepResult]:
        return self._run(list(range(len(self.examples))))

    def step(self, rows: list[int], texts: list[str]) -> list[StepResult]:
        for r, t in zip(rows, texts):
            self.turns[r].append(t)
        return self._run(rows)


def open_session(replay: EnvReplay, examples: list[Example], seeds: list[int], verifier_cfg: Any) -> EnvSession:
    """A batch's session under the verifier's limits (`verifier.timeout_s` per call, `batch_timeout_s` per turn)."""
    return EnvSession(
        replay,
        examples,
        seeds,
        timeout_s=verifier_cfg.timeout_s,
        batch_timeout_s=verifier_cfg.batch_timeout_s,
    )
