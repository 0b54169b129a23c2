"""Rewards: final-answer extraction (`answers.py`), the Countdown expression parser (`countdown_expr.py`), the
verifiers and their time-bounded worker processes (`verifiers.py`). Never imports torch."""
