"""Environments that misbehave, planted by the tests (imported by name in the pool's worker processes)."""

from __future__ import annotations

import os
import time

from rlcompare.envs.base import StepResult


class _Base:
    def __init__(self, **settings):
        self.settings = settings

    def reset(self, example, seed):
        return ""


class Crashing(_Base):
    def step(self, text):
        raise RuntimeError("boom")


class Hanging(_Base):
    def step(self, text):
        time.sleep(3600)


class NanReward(_Base):
    def step(self, text):
        return StepResult("more\n", float("nan"), False)


class Huge(_Base):
    def step(self, text):
        return StepResult("a" * 5_000_000, 0.0, False)


class Dying(_Base):
    def step(self, text):
        os._exit(3)


class NeverDone(_Base):
    def step(self, text):
        return StepResult("again\n", 0.0, False)


class Counting(_Base):
    """Deterministic given its seed: the observation says how many turns it has seen, and the seed."""

    def reset(self, example, seed):
        self.n, self.seed = 0, seed
        return f"s{seed % 10}\n"

    def step(self, text):
        self.n += 1
        return StepResult(f"t{self.n}\n", 1.0 if "1" in text else 0.0, self.n >= 2, {"correct": "1" in text})
