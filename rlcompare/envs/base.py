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

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlcompare.data.types import Example


@dataclass(frozen=True)
class StepResult:
    observation: str | None  # text appended after the policy's turn as environment tokens; None when done
    reward: float  # this turn's reward (per-turn rewards are summed over the episode; end-only tasks give 0 before)
    done: bool  # the episode is over: no further policy turn
    # free-form, JSON-serialisable; info["correct"] (a bool) is the episode's correctness, else its reward > 0
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    def reset(self, example: Example, seed: int) -> str:
        """Start an episode on `example` (its prompt is already the context); returns text appended before the
        first policy turn ("" for none). `seed` is the episode's own: the same seed gives the same episode."""
        ...

    def step(self, policy_text: str) -> StepResult:
        """The policy wrote `policy_text` (one turn, decoded); answer it."""
        ...


FLOAT32_MAX = 3.4028234663852886e38  # an episode's reward is held as float32: a larger one would be inf there


def as_reward(value: Any) -> float | None:
    """`value` as a reward: any real number (a Python int, float or bool, a numpy scalar, a 0-d array or tensor) as a
    float; None when it is not a real number (e.g. "1", a list, a complex). A non-finite one comes back as it is:
    the caller refuses it (env/errors/nan_reward)."""
    value = _scalar(value)
    if not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past a float's range: a real number, not a finite one
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return None


def as_bool(value: Any) -> bool | None:
    """`value` (`info["correct"]`) as a bool (a Python or numpy bool, a 0-d bool array or tensor); None for anything else
    ("no", 1, None): such a reply is refused (env/errors/bad_reply), never read as truthy."""
    value = _scalar(value)
    return value if isinstance(value, bool) else None


def _scalar(value: Any) -> Any:
    """A 0-d array or tensor's Python value (`.item()`); anything else unchanged."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        try:
            return value.item()
        except Exception:
            return None
    return value


def finite_reward(value: float) -> bool:
    """Whether a reward (a turn's, or an episode's sum) is finite where the trainer holds it (float32)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX
