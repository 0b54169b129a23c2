"""The environment interface: one episode of a multi-turn or tool-use task (#51).

The rollout alternates policy turns (sampled as any completion) and environment turns (the observation's text,
tokenized and appended to the context, never sampled and masked from the loss). Shaped after the `reset`/`step`
pair of gym-style libraries (skyrl-gym, openenv, textarena) and the `env_response` of `verifiers`' MultiTurnEnv,
kept to plain text so that an environment needs no tokenizer and can run in the reward worker pool.

An environment is one object per episode: `reset` is called once, then `step` once per policy turn until it says
`done` or the rollout stops it (`env.max_turns`, the episode's token budget). It must be picklable (it is sent to
a worker process) and must not rely on being called in the trainer's process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlcompare.data.types import Example


@dataclass(frozen=True)
class StepResult:
    observation: str | None  # text appended after the policy's turn as environment tokens; None when done
    reward: float  # this turn's reward (per-turn rewards are summed over the episode; end-only tasks give 0 before)
    done: bool  # the episode is over: no further policy turn
    info: dict[str, Any] = field(default_factory=dict)  # free-form, JSON-serialisable (logged with the episode)


@runtime_checkable
class Environment(Protocol):
    def reset(self, example: Example, seed: int) -> str:
        """Start an episode on `example` (its prompt is already the context); returns text appended before the
        first policy turn ("" for none). `seed` is the episode's own: the same seed gives the same episode."""
        ...

    def step(self, policy_text: str) -> StepResult:
        """The policy wrote `policy_text` (one turn, decoded); answer it."""
        ...
