"""env=calc: tool use on the lab task (prompts=chain_calc). The policy may write `<calc>3+8+5</calc>` (the turn
ends at `</calc>`, the stop string its spec declares); the environment appends the value and a newline (`16\\n`, or
`?\\n` for an expression it does not read); a turn without a call is the final answer, scored as the lab's verifier
scores it (the last number stated), reward 1 when right. Declared in rlcompare/env_specs.py (no knob)."""

from __future__ import annotations

import re
from typing import Any

from rlcompare.data.types import Example
from rlcompare.envs.base import StepResult
from rlcompare.rewards.verifiers import ExactMatch

_CALL = re.compile(r"<calc>([^<]*)</calc>\s*$")
_EXPR = re.compile(r"[0-9]{1,6}(?:[+\-*][0-9]{1,6}){0,11}")


def calc_value(expr: str) -> int | None:
    """The value of `expr` (integers joined by + - *, * first), or None when it is anything else."""
    expr = expr.replace(" ", "")
    if not _EXPR.fullmatch(expr):
        return None
    total, sign = 0, 1
    for part in re.split(r"([+\-])", expr):
        if part in ("+", "-"):
            sign = 1 if part == "+" else -1
            continue
        product = 1
        for factor in part.split("*"):
            product *= int(factor)
        total += sign * product
    return total


class CalcEnv:
    """Tool use: `<calc>expr</calc>` answered with its value; a turn without a call is the final answer."""

    def __init__(self, **settings: Any):
        self.verifier = ExactMatch(number="last")
        self.example: Example | None = None

    def reset(self, example: Example, seed: int) -> str:
        self.example = example
        return ""

    def step(self, policy_text: str) -> StepResult:
        call = _CALL.search(policy_text)
        if call is not None:
            value = calc_value(call.group(1))
            return StepResult("?\n" if value is None else f"{value}\n", 0.0, False, {"correct": False, "call": 1})
        ok = self.verifier.score(policy_text, self.example.answer).correct
        return StepResult(None, float(ok), True, {"correct": ok})
