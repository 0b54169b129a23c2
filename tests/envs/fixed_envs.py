"""Environments whose verdict does not depend on what the policy writes (imported by name in the pool's workers), so
that a test can work a run's numbers out from the data alone."""

from __future__ import annotations

from rlcompare.envs.base import StepResult


class EvenAnswer:
    """Two policy turns: the first answered with `again`, reward 1 (which `env.reward=last` discards); the second
    ends the episode, correct (reward 1) exactly when the example's answer is an even number."""

    def __init__(self, **settings):
        self.turns = 0

    def reset(self, example, seed):
        self.example, self.turns = example, 0
        return ""

    def step(self, text):
        self.turns += 1
        if self.turns == 1:
            return StepResult("again\n", 1.0, False, {"correct": True})
        even = int(self.example.answer) % 2 == 0
        return StepResult(None, 1.0 if even else 0.0, True, {"correct": even})
