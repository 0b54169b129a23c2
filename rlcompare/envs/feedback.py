"""env=feedback: guess with feedback, on the default task (prompts=arithmetic). The policy answers; a wrong answer
gets `lower` or `higher` and the question again, up to env.max_turns answers; reward 1 when an answer is right
(`correct`), else 0. The default warm start's labels are off upward, so "lower" is the feedback it needs most.
Declared in rlcompare/env_specs.py (no knob)."""

from __future__ import annotations

import re
from typing import Any

from rlcompare.data.types import Example
from rlcompare.envs.base import StepResult
from rlcompare.rewards.verifiers import ExactMatch

_NUMBER = re.compile(r"-?[0-9]+")


class FeedbackEnv:
    """Guess the sum: `lower` / `higher` and the question again after a wrong answer."""

    def __init__(self, **settings: Any):
        self.verifier = ExactMatch()
        self.example: Example | None = None

    def reset(self, example: Example, seed: int) -> str:
        self.example = example
        return ""

    def step(self, policy_text: str) -> StepResult:
        if self.verifier.score(policy_text, self.example.answer).correct:
            return StepResult(None, 1.0, True, {"correct": True})
        m = _NUMBER.search(policy_text)
        hint = "number" if m is None else "lower" if int(m.group()) > int(self.example.answer) else "higher"
        return StepResult(f"{hint}\n{self.example.prompt}", 0.0, False, {"correct": False})
