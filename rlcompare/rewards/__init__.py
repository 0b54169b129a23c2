"""Rewards: final-answer extraction (`answers.py`), the Countdown expression parser (`countdown_expr.py`), the
verifiers and their time-bounded worker processes (`verifiers.py`), reasoning-gym's scorers behind an audit guard
(`gym_verifier.py`, registered here as verifier=reasoning_gym). Never imports torch."""

from rlcompare.rewards import gym_verifier  # noqa: F401 - registers verifier=reasoning_gym (verifiers.REGISTERED)
