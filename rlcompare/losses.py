"""Moved to rlcompare.algos.losses; kept as the documented import path (docs/api.md, the README's "Library API").

Code inside rlcompare imports rlcompare.algos.losses (tests/test_layers.py); monkeypatch that module, not this one.
"""

from rlcompare.algos.losses import *  # noqa: F401,F403
