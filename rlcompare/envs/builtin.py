"""The built-in environments (conf/env/) and how an environment is built from its spec (#51).

- `feedback`: guess with feedback, on the default task (prompts=arithmetic). The policy answers; a wrong answer
  gets `lower` or `higher` and the question again, up to env.max_turns answers; reward 1 when an answer is right
  (`correct`), else 0. The default warm start's labels are off upward, so "lower" is the feedback it needs most.
- `calc`: tool use on the lab task (prompts=chain_calc). The policy may write `<calc>3+8+5</calc>` (the turn ends
  at `</calc>`); the environment appends the value and a newline (`16\\n`, or `?\\n` for an expression it does
  not read); a turn without a call is the final answer, scored as the lab's verifier scores it (the last number
  stated), reward 1 when right.

A spec is `{"name": ..., "target": "module:attribute" (name=custom), "settings": {...}}`; `build` is called in
the worker process (rlcompare.envs.runner), so a custom target must be importable there.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from rlcompare.data.types import Example
from rlcompare.envs.base import Environment, StepResult
from rlcompare.rewards.verifiers import ExactMatch

_NUMBER = re.compile(r"-?[0-9]+")
_CALL = re.compile(r"<calc>([^<]*)</calc>\s*$")
_EXPR = re.compile(r"[0-9]{1,6}(?:[+\-*][0-9]{1,6}){0,11}")


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


_CLASSES = {"feedback": FeedbackEnv, "calc": CalcEnv}


def build(spec: dict) -> Environment:
    """The environment `spec` names: a built-in, or (name=custom) `target` "module:attribute" called with the
    settings."""
    settings = dict(spec.get("settings") or {})
    if spec["name"] in _CLASSES:
        return _CLASSES[spec["name"]](**settings)
    return resolve_target(spec["target"])(**settings)


def resolve_target(target: str):
    """The callable "module:attribute" names (ImportError / AttributeError when it does not exist)."""
    module, _, attr = str(target).partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
