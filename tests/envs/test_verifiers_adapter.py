"""The verifiers adapter (#51) on a number-guessing environment written here against verifiers' v1 API (no hub, no
network, no model): the policy's turns are scripted, the env answers "higher"/"lower", the task's rewards score it.

Rewards, worked by hand: `solved` (weight 1) is 1 when the last guess is the secret; `brevity` (weight 0.5) is
1/(number of guesses). Secret 6, guesses 3, 8, 6: 1*1 + 0.5*(1/3) = 7/6. Guesses 1..5 (the env allows 5): 1*0 +
0.5*(1/5) = 0.1.
"""

from __future__ import annotations

import asyncio
import math
import pickle
import sys

import pytest

vf = pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed (pip install .[verifiers])")

from rlcompare.envs.base import Environment  # noqa: E402
from rlcompare.envs.verifiers_adapter import (  # noqa: E402
    TASK_KEY,
    VerifiersSetupError,
    build_verifiers_env,
    settings_from,
    verifiers_examples,
)

MODULE = "rlc_test_guess_env"  # verifiers loads a taskset by import name: this module, under a flat alias
sys.modules[MODULE] = sys.modules[__name__]
MAX_GUESSES = 5


class GuessData(vf.TaskData):
    secret: int
    mode: str = "guess"  # guess | raise | hang | nan


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        if self.data.mode == "nan":
            return float("nan")
        replies = [m.content for m in trace.assistant_messages]
        return 1.0 if replies and replies[-1].strip() == str(self.data.secret) else 0.0

    @vf.reward(weight=0.5)
    async def brevity(self, trace: vf.Trace) -> float:
        return 1.0 / max(1, len(trace.assistant_messages))


class GuessConfig(vf.TasksetConfig):
    secrets: list[int] = [6, 2]
    mode: str = "guess"
    user_opens: bool = False  # a prompt-less task: the env's first user turn opens the conversation


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        for i, secret in enumerate(self.config.secrets):
            prompt = None if self.config.user_opens else f"Guess my number from 1 to 9 (game {i})."
            yield GuessTask(GuessData(idx=i, prompt=prompt, secret=secret, mode=self.config.mode))


class GuessEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as game:
            segment = await (game.turn("I have a number from 1 to 9.") if task.data.prompt is None else game.turn())
            for _ in range(MAX_GUESSES - 1):
                if task.data.mode == "raise":
                    raise RuntimeError("the board broke")
                if task.data.mode == "hang":
                    await asyncio.sleep(3600)
                guess = int(segment.last_reply)
                if guess == task.data.secret:
                    return
                segment = await game.turn("higher" if guess < task.data.secret else "lower")


__all__ = ["GuessTaskset", "GuessEnv"]


def _episode(cfg=None, game=0):
    factory = build_verifiers_env({"kind": "verifiers", "module": MODULE, **(cfg or {})})
    examples = verifiers_examples(factory.env())
    env = factory(examples[game])
    return env, examples[game], env.reset(examples[game], seed=0)


def test_the_taskset_becomes_prompts_and_each_task_an_episode():
    factory = build_verifiers_env({"module": MODULE, "env_args": {"secrets": [6, 2, 9]}})
    examples = verifiers_examples(factory.env())
    assert [e.prompt for e in examples] == [f"Guess my number from 1 to 9 (game {i})." for i in range(3)]
    assert [e.meta[TASK_KEY] for e in examples] == [0, 1, 2]
    assert verifiers_examples(factory.env(), limit=2) == examples[:2]
    assert isinstance(factory(examples[0]), Environment)


def test_a_scripted_game_gets_the_env_replies_and_the_tasks_weighted_reward():
    env, _, first = _episode()
    assert first == ""  # a prompted task: its prompt is already the context, the policy speaks first
    r1 = env.step("3")
    assert (r1.observation, r1.reward, r1.done) == ("higher", 0.0, False)
    r2 = env.step("8")
    assert (r2.observation, r2.reward, r2.done) == ("lower", 0.0, False)
    r3 = env.step("6")
    assert r3.observation is None and r3.done
    assert r3.reward == pytest.approx(1.0 + 0.5 / 3)
    assert r3.info["vf_rewards"] == pytest.approx({"solved": 1.0, "brevity": 1 / 3})
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("6")


def test_running_out_of_guesses_ends_unsolved():
    env, _, _ = _episode(game=1)  # secret 2
    results = [env.step(g) for g in ["5", "4", "3", "1", "9"]]
    assert [r.observation for r in results[:4]] == ["lower", "lower", "lower", "higher"]
    assert [r.done for r in results] == [False, False, False, False, True]
    assert results[-1].reward == pytest.approx(0.5 * (1 / 5))


def test_a_user_opened_task_gives_the_opening_turn_from_reset():
    env, example, first = _episode({"env_args": {"user_opens": True}})
    assert example.prompt == "" and first == "I have a number from 1 to 9."
    assert env.step("6").reward == pytest.approx(1.0 + 0.5)


def test_an_env_that_raises_ends_its_episode_with_the_reason():
    env, _, _ = _episode({"env_args": {"mode": "raise"}})
    r = env.step("3")
    assert (r.observation, r.reward, r.done) == (None, 0.0, True)
    assert r.info["error"] == "verifiers env raised RuntimeError: the board broke"


def test_an_env_that_hangs_is_stopped_after_the_turn_timeout():
    env, _, _ = _episode({"env_args": {"mode": "hang"}, "turn_timeout_s": 0.2})
    r = env.step("3")
    assert r.done and r.reward == 0.0 and r.info["error"].startswith("timeout: the verifiers env took over 0.2s")


def test_a_nan_reward_is_refused_and_recorded():
    env, _, _ = _episode({"env_args": {"mode": "nan"}})
    r = env.step("6")
    assert r.done and r.reward == 0.0 and "not finite" in r.info["error"]
    assert math.isnan(r.info["vf_rewards"]["solved"])


def test_an_episode_stopped_early_is_closed_and_a_reset_starts_afresh():
    env, example, _ = _episode()
    assert env.step("3").observation == "higher"
    env.close()  # the rollout's max_turns stopped it
    assert env.reset(example, seed=1) == ""
    assert env.step("6").reward == pytest.approx(1.5)


def test_the_factory_and_a_fresh_episode_pickle_a_live_one_refuses():
    factory = build_verifiers_env({"module": MODULE})
    example = verifiers_examples(factory.env())[0]
    env = pickle.loads(pickle.dumps(factory(example)))  # sent to a worker before reset; the env reloads there
    assert env.reset(example, seed=0) == "" and env.step("6").done
    live = factory(example)
    live.reset(example, seed=0)
    with pytest.raises(TypeError, match="cannot be pickled once reset"):
        pickle.dumps(live)
    live.close()


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({}, "env.module: set it"),
        ({"module": MODULE, "modul": "x"}, "env.modul: not a verifiers adapter key"),
        ({"module": MODULE, "turn_timeout_s": 0}, "env.turn_timeout_s=0.0: must be a positive"),
        ({"module": MODULE, "env_args": [1]}, "env.env_args: a mapping"),
    ],
)
def test_bad_settings_name_the_key(cfg, message):
    with pytest.raises(VerifiersSetupError, match=message):
        settings_from(cfg)


def test_a_module_that_is_not_installed_or_a_wrong_role_is_refused_before_any_episode():
    with pytest.raises(VerifiersSetupError, match="env.module='no_such_taskset_xyz'"):
        build_verifiers_env({"module": "no_such_taskset_xyz"})
    with pytest.raises(VerifiersSetupError, match=r"env.role='solver': this verifiers env's seats are \['agent'\]"):
        build_verifiers_env({"module": MODULE, "role": "solver"})
    with pytest.raises(VerifiersSetupError, match="env.module=.*verifiers refused it"):
        build_verifiers_env({"module": MODULE, "env_args": {"secrets": "six"}})


def test_an_example_from_another_prompt_set_is_refused():
    factory = build_verifiers_env({"module": MODULE})
    from rlcompare.data.types import Example

    with pytest.raises(VerifiersSetupError, match="prompts=verifiers"):
        factory(Example(prompt="2+2", answer="4"))
