"""Rewards, split by job: final-answer extraction (`answers.py`) and the other text helpers (`text.py`), the
Countdown expression parser (`countdown_expr.py`), the built-in verifiers (`verifiers.py`; reasoning-gym's scorers
behind an audit guard in `gym_verifier.py`), the registry every verifier is declared in and the builder
(`registry.py`: `@register_verifier`, `build_verifier`), batch scoring under time and memory limits in worker
processes (`pool.py`: `score_batch`). Never imports torch."""

from rlcompare.rewards import gym_verifier  # noqa: F401 - registers verifier=reasoning_gym
from rlcompare.rewards.registry import build_verifier, register_verifier  # noqa: F401 - the extension point
