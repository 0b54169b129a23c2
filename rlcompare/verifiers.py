"""Moved to rlcompare.rewards.verifiers; kept as the documented import path (docs/api.md, the README's "Library API").

Code inside rlcompare imports rlcompare.rewards.verifiers (tests/test_layers.py); monkeypatch that module, not this one.
"""

from rlcompare.rewards.verifiers import *  # noqa: F401,F403
