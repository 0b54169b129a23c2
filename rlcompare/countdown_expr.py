"""Moved to rlcompare.rewards.countdown_expr; kept as the documented import path (docs/api.md, the README's "Library API").

Code inside rlcompare imports rlcompare.rewards.countdown_expr (tests/test_layers.py); monkeypatch that module, not this one.
"""

from rlcompare.rewards.countdown_expr import *  # noqa: F401,F403
