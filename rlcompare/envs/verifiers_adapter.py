"""Drive a `verifiers` (PrimeIntellect, PyPI 0.4) environment through rlcompare's `Environment` (#51).

verifiers 0.4.0's wheel has no `MultiTurnEnv` any more (`env_response` / `is_completed` / `Rubric`, in
`verifiers/envs/multiturn_env.py` up to 0.3.0, moved to `verifiers.legacy` in the repository and left out of the
wheel): it ships only `verifiers.v1`, and that is what this adapter drives. A v1 environment is a `Taskset` (its `Task`s, each scoring a finished `Trace`
with its `@vf.reward` methods) and an `Env` whose `async run(task, agents)` is the episode's control flow: it
calls `agents.<role>.interaction(task)` and `await interaction.turn(text)` to hand the model a user turn and get
the model's reply. The model is called from inside the environment, so this adapter inverts the control:
`agents.<role>` is our stand-in (`_PolicyAgent`), whose `turn(text)` suspends `run` and returns `text` to the
rollout as the observation; our `step(policy_text)` resumes it with the policy's reply. When `run` returns, the
task's own `score(trace)` gives the reward. verifiers' harnesses, runtimes, clients and model servers are never
started: the environment's and the task's code (installed by the user, loaded by import name) is all that runs.

Messages as text: the Example's prompt is the task's prompt already in the context, so a prompted task's opening
`turn()` observes "". A user turn `turn("higher")` is the observation "higher" (a list of messages: their text
contents joined by blank lines); our policy text is one `AssistantMessage(content=policy_text)` in the trace
(no tool calls: a tool-calling harness is not driven). Each observation is appended as written: a chat template
for environment turns, if any, is the rollout's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from rlcompare import env_specs
from rlcompare.data.types import Example
from rlcompare.env_specs import VerifiersSettings  # the one declaration of env=verifiers' keys
from rlcompare.envs.base import StepResult

TASK_KEY = "vf_task"  # Example.meta key: the task's position in the taskset's iteration (verifiers_examples)


class VerifiersSetupError(ValueError):
    """A bad `env.settings.*` value for a verifiers environment (raised before any episode runs)."""


def settings_from(cfg: Mapping[str, Any]) -> VerifiersSettings:
    """`env.settings.*` -> settings, checked by the spec's own declaration (`env_specs.VerifiersSettings`: an
    unknown key, a value of another type, its `check()`), with one-line errors naming the key and the fix (no
    verifiers import)."""
    try:
        settings = env_specs.spec("verifiers").settings_of(cfg)
    except ValueError as e:
        raise VerifiersSetupError(str(e)) from None
    return replace(settings, module=settings.module.strip(), env_args=dict(settings.env_args or {}))


def load_env(settings: VerifiersSettings):
    """The verifiers `Env` by import name, the way `vf-eval` builds it (no model, no network)."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise VerifiersSetupError(
            f"env=verifiers needs the `verifiers` package (>=0.4): pip install 'rlcompare[verifiers]' ({e})"
        ) from None
    raw = {"taskset": {"id": settings.module, **settings.env_args}}
    if settings.env_id:
        raw["id"] = settings.env_id
    try:
        env = vf.load_environment(vf.resolve_env_config(raw))
    except (ImportError, TypeError, ValueError, AttributeError) as e:  # pydantic's ValidationError is a ValueError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise VerifiersSetupError(
            f"env.settings.module={settings.module!r} / env.settings.env_args: verifiers refused it: {first}"
        )
    _check_role(env, settings.role)
    return env


def _check_role(env, role: str) -> str:
    seats = list(env._agent_specs)
    if role and role not in seats:
        raise VerifiersSetupError(f"env.settings.role={role!r}: this verifiers env's seats are {seats}; pick one")
    if not role and len(seats) != 1:
        raise VerifiersSetupError(
            f"env.settings.role: this verifiers env has seats {seats}; name the one the policy plays"
        )
    return role or seats[0]


def verifiers_examples(env, limit: int | None = None) -> list[Example]:
    """The taskset's tasks as prompts: the task's prompt text (system prompt not included; `Example.meta` keeps
    it), no reference answer (the task scores itself), and the task's position under `meta["vf_task"]`."""
    out = []
    for i, task in enumerate(itertools.islice(iter(env.taskset), limit)):
        data = task.data
        meta = {TASK_KEY: i, "vf_system_prompt": data.system_prompt}
        out.append(Example(prompt=data.prompt_text, answer="", meta=meta))
    return out


_LOADED: dict[VerifiersSettings, Any] = {}  # one loaded env per process and settings (a worker reuses it)


def loaded_env(settings: VerifiersSettings):
    key = replace(settings, env_args=json.dumps(settings.env_args, sort_keys=True, default=str))
    if key not in _LOADED:
        _LOADED[key] = load_env(settings)
    return _LOADED[key]


def build_verifiers_env(cfg: Mapping[str, Any]) -> Callable[[Example], VerifiersEnv]:
    """The check and builder for the env config: the `env.settings` keys checked and the env loaded once (a bad
    module, argument or seat fails here, before anything heavy); returns `factory(example) -> Environment`."""
    settings = settings_from(cfg)
    loaded_env(settings)
    return functools.partial(_for_example, dataclasses.asdict(settings))


def _for_example(settings: dict, example: Example) -> VerifiersEnv:
    return VerifiersEnv(**settings)


def export_prompts(path: str, module: str, env_args: Mapping | None = None, env_id: str = "", limit=None) -> int:
    """The taskset's tasks as a prompt file for `prompts.kind=file` (`{"question": prompt text, "answer": task
    position}` per line); returns the number of rows written."""
    env = loaded_env(settings_from({"module": module, "env_args": dict(env_args or {}), "env_id": env_id}))
    rows = [{"question": e.prompt, "answer": str(e.meta[TASK_KEY])} for e in verifiers_examples(env, limit)]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return len(rows)


def _text_of(message) -> str:
    """A verifiers turn (a string, or a list of messages / wire dicts) as the text we append."""
    if message is None:
        return ""
    if isinstance(message, str):
        return message
    texts = []
    for m in message:
        content = m.get("content") if isinstance(m, Mapping) else getattr(m, "content", None)
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):  # content parts: keep the text ones
            texts += [p.get("text", "") if isinstance(p, Mapping) else getattr(p, "text", "") or "" for p in content]
    return "\n\n".join(t for t in texts if t)


class _Exchange:
    """The two futures that pass control between the env's `run` and the rollout, on the episode's own loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.observation: asyncio.Future = loop.create_future()
        self.reply: asyncio.Future | None = None

    async def ask_policy(self, text: str) -> str:
        self.reply = self.loop.create_future()
        self.observation.set_result(text)
        return await self.reply

    def answer(self, policy_text: str) -> None:
        self.observation = self.loop.create_future()  # before resuming `run`: its next request lands here
        self.reply.set_result(policy_text)


def _last(trace) -> int | None:
    return len(trace.nodes) - 1 if trace.nodes else None


class _PolicyInteraction:
    """Stands in for `vf.Interaction`: the same `turn` / `trace` / `close`, with our policy as the model."""

    def __init__(self, task, trace, exchange: _Exchange):
        self.task, self.trace, self._exchange = task, trace, exchange
        self._started = False

    async def turn(self, message=None):
        import verifiers.v1 as vf
        from verifiers.v1.graph import MessageNode

        prompted = self.task.data.prompt is not None
        if message is None and (self._started or not prompted):
            raise ValueError("turn(): a bare turn() takes only a prompted task's opening reply")
        if message is not None and prompted and not self._started:
            raise ValueError("turn(): the task's prompt opens this exchange; take its first reply with turn()")
        self._started = True
        if message is not None:
            for m in [message] if isinstance(message, str) else message:
                msg = vf.UserMessage(content=m) if isinstance(m, str) else m
                self.trace.nodes.append(MessageNode(parent=_last(self.trace), message=msg))
        reply = await self._exchange.ask_policy(_text_of(message))
        assistant = vf.AssistantMessage(content=reply)
        self.trace.nodes.append(MessageNode(parent=_last(self.trace), message=assistant, sampled=True))
        return vf.Segment(messages=[assistant])

    async def close(self):
        return self.trace


class _PolicyAgent:
    """Stands in for `vf.Agent` on the policy's seat: `interaction(task)` and a one-segment `run(task)`."""

    def __init__(self, name: str, exchange: _Exchange, traces: list):
        self.name, self._exchange, self._traces = name, exchange, traces
        self.trainable = True

    @contextlib.asynccontextmanager
    async def interaction(self, task, **_):
        import verifiers.v1 as vf

        trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name=self.name),
        )
        self._traces.append((task, trace))
        yield _PolicyInteraction(task, trace, self._exchange)

    async def run(self, task, **_):
        async with self.interaction(task) as it:
            await it.turn()
        return it.trace


class _Agents:
    def __init__(self, policy: _PolicyAgent):
        self._policy = policy

    def __getattr__(self, name: str):
        policy = self.__dict__.get("_policy")
        if policy is None or name != policy.name:
            raise AttributeError(
                f"seat {name!r} needs a model: only the policy's seat (env.settings.role) is driven here"
            )
        return policy


class VerifiersEpisodeError(RuntimeError):
    """The verifiers env failed in an episode (raised, took over `turn_timeout_s` on a turn, its scoring raised):
    raised from `step` so that the rollout's runner ends the episode and counts the reason (env/errors/raised)."""


def task_for(env, example: Example):
    """The verifiers task an example stands for: `meta["vf_task"]` (verifiers_examples), else the task position a
    prompt file of `export_prompts` holds as the answer (its prompt text must be in the example's prompt)."""
    idx = example.meta.get(TASK_KEY)
    from_file = idx is None and example.answer.strip().isdigit()
    if from_file:
        idx = int(example.answer)
    task = next(itertools.islice(iter(env.taskset), idx, None), None) if isinstance(idx, int) else None
    if task is None or (from_file and task.data.prompt_text not in example.prompt):
        raise VerifiersSetupError(
            f"env.settings.module: no task of the verifiers taskset matches the example {example.prompt[:60]!r}; use "
            "its own prompts (export_prompts(...) then prompts.kind=file prompts.path=<that file>)"
        )
    return task


class VerifiersEnv:
    """One episode of a verifiers env as an rlcompare `Environment` (`env.name=custom env.target=
    rlcompare.envs.verifiers_adapter:VerifiersEnv env.settings.module=<taskset import name>`). `reset` starts the
    env's `run(task, agents)` on an event loop of its own and runs it to its first request for the policy; each
    `step` resumes it with the policy's text until its next request (an observation) or its end (done, the task's
    weighted reward sum, NaN passed on for the runner to refuse). Deterministic given the env's code: the runner
    replays an episode's turns in a fresh object. Picklable until `reset` (a live episode holds its loop)."""

    def __init__(self, **settings: Any):
        self.settings = settings_from(settings)
        self._loop = self._run = self._exchange = None
        self._traces: list = []
        self._done = False
        self._final: StepResult | None = None

    @staticmethod
    def check(settings: Mapping[str, Any]) -> None:
        """For the env config's check (before anything heavy): the settings' keys, the env loaded, the seat."""
        build_verifiers_env(settings)

    def __getstate__(self):
        if self._loop is not None:
            raise TypeError("a verifiers episode cannot be pickled once reset (it holds its event loop)")
        return self.__dict__

    def reset(self, example: Example, seed: int) -> str:
        self.close()
        env = loaded_env(self.settings)
        task = task_for(env, example)
        self._loop = asyncio.new_event_loop()
        self._exchange = _Exchange(self._loop)
        self._traces, self._done, self._final = [], False, None
        agents = _Agents(_PolicyAgent(_check_role(env, self.settings.role), self._exchange, self._traces))
        self._run = self._loop.create_task(env.run(task, agents))
        result = self._advance()
        if result.done:  # the env ended without asking the policy anything: step() reports it
            self._final = result
            return ""
        return result.observation

    def step(self, policy_text: str) -> StepResult:
        if self._final is not None:
            result, self._final = self._final, None
            return result
        if self._done or self._loop is None:
            raise RuntimeError("step() after the episode ended (or before reset)")
        self._exchange.answer(policy_text)
        return self._advance()

    def _advance(self) -> StepResult:
        waiting, limit = {self._run, self._exchange.observation}, self.settings.turn_timeout_s
        try:
            done, _ = self._loop.run_until_complete(asyncio.wait(waiting, timeout=limit, return_when="FIRST_COMPLETED"))
        except BaseException:  # KeyboardInterrupt etc.: clean up, then let it through
            self.close()
            raise
        if self._exchange.observation in done:
            return StepResult(self._exchange.observation.result(), 0.0, False)
        if not done:
            self._fail(f"timeout: the verifiers env took over {limit}s on one turn")
        if self._run.exception() is not None:
            e = self._run.exception()
            self._fail(f"verifiers env raised {type(e).__name__}: {e}")
        return self._score()

    def _score(self) -> StepResult:
        if not self._traces:
            self._fail("the verifiers env ended without opening an interaction on the policy's seat")
        task, trace = self._traces[-1]
        try:
            self._loop.run_until_complete(asyncio.wait_for(task.score(trace), self.settings.turn_timeout_s))
        except Exception as e:
            self._fail(f"verifiers task scoring raised {type(e).__name__}: {e}")
        rewards = {name: (r.score if r is not None else None) for name, r in trace.rewards.items()}
        reward = float(trace.reward)
        self._done = True
        self.close()
        info = {"correct": bool(reward > 0), "vf_rewards": rewards, "vf_metrics": dict(trace.metrics)}
        return StepResult(None, reward, True, info)

    def _fail(self, reason: str):
        self._done = True
        self.close()
        raise VerifiersEpisodeError(reason[:500])

    def close(self) -> None:
        """Cancel a live episode's `run` and close its loop (at the episode's end; the rollout may call it when it
        stops an episode early, and an object dropped mid-episode closes on collection)."""
        if self._loop is None:
            return
        if self._run is not None and not self._run.done():
            self._run.cancel()
            with contextlib.suppress(BaseException):
                self._loop.run_until_complete(self._run)
        self._loop.close()
        self._loop = self._run = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()
