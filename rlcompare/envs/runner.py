"""Environments stepped in the reward worker pool, under the verifier's time and memory limits (#51).

Every `reset` and `step` runs in a worker process of `rlcompare.rewards.pool` (its public entry,
`score_batch`: a per-call deadline of `verifier.timeout_s`, a hard kill past it, an address-space cap, a batch
bound of `verifier.batch_timeout_s`). Nothing the worker sends back is unpickled (its replies are JSON), so an
environment's state never comes back either: a worker rebuilds the episode by replaying it, `reset(example,
seed)` then `step` on each policy turn so far (an environment is deterministic given its seed, as
`envs.base` asks), and answers the last step as JSON in the score's `reason`. Every earlier answer of the replay
must be the one the rollout got (the session sends them along): one that differs means the policy saw another
episode than the one replayed, and the episode ends `not_replayable`. A crash, a hang, a reward that is not a
finite real number, a correctness that is not a bool or a huge observation becomes a `StepResult` with
`info["error"]` naming why; `rollout.episodes` ends the episode with that reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from rlcompare.data.types import Example
from rlcompare import env_specs
from rlcompare.envs import build
from rlcompare.envs.base import StepResult, as_bool, as_reward, finite_reward
from rlcompare.rewards.pool import Score, score_batch
from rlcompare.rewards.verifiers import Verifier

MAX_OBSERVATION_CHARS = 65_536  # a worker answers a longer observation as an error (huge_observation)


class EnvReplay(Verifier):
    """What the pool's workers hold: the environment's spec (plain data: it is pickled to every worker, which
    cannot rebuild a run-time config class); `score("", (example, seed, turns, seen))` replays the episode and
    answers its last step as JSON in `Score.reason` (`error` set, with the reason, when it failed). `seen`: the
    replies the rollout already got for this episode (reset's, then each step's), which the replay must give again
    (`not_replayable` otherwise)."""

    name = "env"
    bounded = False
    isolation = "process"

    def __init__(self, spec: dict, workers: int | None = None):
        self.spec = build.worker_spec(plain(spec))  # a registered name resolved here, where it is registered
        self.workers = workers

    def warm(self) -> None:
        """In a worker, before it reports ready (not charged to any step's time limit): import the factory's
        module and run its `check(settings)` if it has one (the verifiers adapter loads its environment there: an
        import of about 12 s). A failure here is left for the steps to report (env/errors/raised)."""
        try:
            check = getattr(env_specs.resolve_factory(self.spec["target"]), "check", None)
            if callable(check):
                check(self.spec.get("settings") or {})
        except Exception:
            pass

    def score(self, completion: str, job) -> Score:
        example, seed, turns, seen = job
        try:
            env = build.build(self.spec)
            reply = _reply_of(StepResult(env.reset(example, seed), 0.0, False))
            for k, text in enumerate(turns):
                if reply in REPLY_ERRORS:
                    break
                if k < len(seen) and reply != seen[k]:
                    return Score(0.0, False, True, "not_replayable")
                reply = _reply_of(env.step(text))
        except Exception:
            return Score(0.0, False, True, "raised")
        return Score(0.0, False, reply in REPLY_ERRORS, reply)


REPLY_ERRORS = ("bad_reply", "nan_reward", "huge_observation")


def _reply_of(res) -> str:
    """One step's answer as the JSON a worker sends ({observation, reward, done, correct: a bool or null when the
    environment did not say}), or the reason it is refused (one of REPLY_ERRORS): not a StepResult, a reward that
    is not a real number or not finite, a correctness that is not a bool, an observation not text or too long."""
    if not isinstance(res, StepResult):
        return "bad_reply"
    reward = as_reward(res.reward)
    info = {} if res.info is None else res.info
    said = info.get("correct") if isinstance(info, dict) else None  # None: not said, the reward decides
    correct = None if said is None else as_bool(said)
    if reward is None or not isinstance(info, dict) or (said is not None and correct is None):
        return "bad_reply"
    if not finite_reward(reward):
        return "nan_reward"
    if res.observation is not None and not isinstance(res.observation, str):
        return "bad_reply"
    if res.observation is not None and len(res.observation) > MAX_OBSERVATION_CHARS:
        return "huge_observation"
    metrics = _metrics_of(info.get("metrics"))
    if metrics is None:
        return "bad_reply"
    reply = {"observation": res.observation, "reward": reward, "done": bool(res.done), "correct": correct}
    return json.dumps({**reply, "metrics": metrics} if metrics else reply)


MAX_METRICS = 64  # names one step may report (an environment declares its few; more is a runaway dict)


def _metrics_of(reported: Any) -> dict | None:
    """`info["metrics"]` as {name: float} ({} when absent), or None when it is not a mapping of at most
    MAX_METRICS short text names to finite real numbers. Whether its names are declared is checked where the
    spec is known (`rollout.episodes`)."""
    if reported is None:
        return {}
    if not isinstance(reported, Mapping) or len(reported) > MAX_METRICS:
        return None
    out = {}
    for name, value in reported.items():
        number = as_reward(value)
        if not isinstance(name, str) or len(name) > 64 or number is None or not finite_reward(number):
            return None
        out[name] = number
    return out


def plain(obj: Any) -> Any:
    """`obj` as plain Python containers (dict, list) all the way down: an OmegaConf node (`env.settings` of the
    composed config, and a node inside it) becomes its container, resolved."""
    if OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def _step_result(s: Score) -> StepResult:
    """A worker's score as the step it answered (`info["error"]`: why not, when it failed; `info["correct"]` only
    when the environment set it)."""
    if s.error:
        return StepResult(None, 0.0, True, {"error": s.reason or "raised"})
    try:
        d = json.loads(s.reason)
        obs, reward, done, correct = d["observation"], d["reward"], d["done"], d["correct"]
        ok = (
            (obs is None or isinstance(obs, str))
            and isinstance(done, bool)
            and (correct is None or isinstance(correct, bool))
        )
        metrics = _metrics_of(d.get("metrics"))
        if ok and metrics is not None and isinstance(reward, (int, float)) and not isinstance(reward, bool):
            info = {} if correct is None else {"correct": correct}
            return StepResult(obs, float(reward), done, {**info, "metrics": metrics} if metrics else info)
    except Exception:
        pass
    return StepResult(None, 0.0, True, {"error": "bad_reply"})


class EnvSession:
    """The environments of one batch of episodes (`rollout.episodes.Session`), one per row, each remembered as
    (example, seed, its policy turns so far, the replies it got so far) and stepped in the pool."""

    def __init__(self, replay: EnvReplay, examples: list[Example], seeds: list[int], *, timeout_s, batch_timeout_s):
        self.replay, self.examples, self.seeds = replay, list(examples), [int(s) for s in seeds]
        self.turns: list[list[str]] = [[] for _ in self.examples]
        self.seen: list[list[str]] = [[] for _ in self.examples]  # each row's replies (JSON), reset's first
        self.timeout_s, self.batch_timeout_s = timeout_s, batch_timeout_s

    def _run(self, rows: list[int]) -> list[StepResult]:
        jobs = [(self.examples[r], self.seeds[r], list(self.turns[r]), list(self.seen[r])) for r in rows]
        scores = score_batch(
            self.replay, [""] * len(jobs), jobs, timeout_s=self.timeout_s, batch_timeout_s=self.batch_timeout_s
        )
        for r, s in zip(rows, scores):
            self.seen[r].append(s.reason)
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
