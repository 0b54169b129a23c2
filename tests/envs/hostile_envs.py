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


class Replies:
    """One step, ended: the reward and `info` the example's answer names (tests/envs/test_edges.py), so that one
    batch of a session holds every case."""

    CASES = {
        "unsaid": (1.0, {}),  # no verdict: correct is the reward > 0
        "unsaid_zero": (0.0, {}),
        "said_false": (1.0, {"correct": False}),  # a verdict wins over the reward
        "none_said": (0.5, {"correct": None}),  # None: not said
        "int": (2, {}),
        "bool": (True, {}),
        "numpy": ("numpy", {"correct": "numpy_bool"}),
        "tensor": ("tensor", {}),
        "str_reward": ("1", {}),
        "inf": (float("inf"), {}),
        "float32_inf": (1e39, {}),  # finite as a Python float, inf as the trainer's float32
        "huge_int": (10**400, {}),
        "correct_no": (1.0, {"correct": "no"}),
        "correct_one": (1.0, {"correct": 1}),
    }

    def __init__(self, **settings):
        pass

    def reset(self, example, seed):
        self.case = example.answer
        return ""

    def step(self, text):
        reward, info = self.CASES[self.case]
        if reward == "numpy" or info.get("correct") == "numpy_bool":
            import numpy as np

            reward, info = np.float32(0.25), {"correct": np.bool_(True)}
        elif reward == "tensor":
            import torch

            reward = torch.tensor(0.75, dtype=torch.float64)
        return StepResult(None, reward, True, info)


class Drifting(_Base):
    """Not deterministic given its seed: each object's observations carry a number drawn from the OS."""

    def reset(self, example, seed):
        self.salt = os.urandom(4).hex()
        return ""

    def step(self, text):
        return StepResult(f"{self.salt}\n", 0.0, False)


class HangingTool(_Base):
    """Starts a tool process (which inherits the worker's stderr), then hangs: the tool must not outlive the run.
    Each tool writes its pid to the folder `env.settings.pids` (when set)."""

    def step(self, text):
        import subprocess
        import sys

        tool = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if self.settings.get("pids"):
            with open(os.path.join(self.settings["pids"], str(tool.pid)), "w"):
                pass
        time.sleep(3600)


class Unsaid(_Base):
    """Reward 1 on the first turn, done, and no `info["correct"]`: every episode is correct (reward > 0)."""

    def step(self, text):
        return StepResult(None, 1.0, True)
