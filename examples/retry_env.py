"""A new environment in one file: retries that pay less. The policy answers the prompt; a wrong answer gets
"no" and the question again, up to ``env.max_turns`` answers; a right answer at the k-th try earns

    reward = decay ** (k - 1)        (decay = env.settings.decay, its one knob; 1.0: every right answer earns 1)

so that a policy learns to be right at the first try rather than eventually. The verdict is the default task's
(``exact_match``: the first number stated is the answer).

What this file declares is all there is (docs/api.md, "Adding an environment"): the spec gives the config its name
(``env.name=retry``), its knob (``env.settings.decay``, checked before anything heavy), the metric it reports
(``tries``: the row's ``env/retry/tries``) and its doc line; the class
is one episode (``reset`` / ``step``, rlcompare/envs/base.py), built in the reward worker pool from the settings.
From the repository's root: ``rlcompare train env.name=retry env.module=examples.retry_env
+env.settings.decay=0.5`` (tests/test_api_example_env_cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcompare.env_specs import EnvSpec, knob, register_environment
from rlcompare.envs.base import StepResult
from rlcompare.rewards.verifiers import ExactMatch


@dataclass(frozen=True)
class RetrySettings:
    decay: float = knob(0.5, "retry: a right answer at the k-th try earns decay ** (k - 1)")

    def check(self) -> None:  # cheap, before anything heavy: name the key and the fix
        if not 0 <= self.decay <= 1:
            raise ValueError(f"env.settings.decay={self.decay} must be in [0, 1]; e.g. 0.5 (halved at every retry)")


@register_environment(
    EnvSpec("retry", RetrySettings, metrics=("tries",), doc="retries that pay less (an example: examples/retry_env.py)")
)
class RetryEnv:
    def __init__(self, decay: float):  # the settings' fields, as keyword arguments
        self.decay, self.verifier = decay, ExactMatch()

    def reset(self, example, seed: int) -> str:
        self.example, self.tries = example, 0
        return ""  # nothing before the first answer: the prompt is already the context

    def step(self, policy_text: str) -> StepResult:
        self.tries += 1
        said = {"tries": self.tries}  # a declared metric: the row's env/retry/tries, the mean over the episodes
        if self.verifier.score(policy_text, self.example.answer).correct:
            return StepResult(None, self.decay ** (self.tries - 1), True, {"correct": True, "metrics": said})
        return StepResult(f"no\n{self.example.prompt}", 0.0, False, {"correct": False, "metrics": said})
