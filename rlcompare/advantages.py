"""Moved to rlcompare.algos.advantages; kept as the documented import path (docs/api.md, the README's "Library API").

Code inside rlcompare imports rlcompare.algos.advantages (tests/test_layers.py); monkeypatch that module, not this one.
"""

from rlcompare.algos.advantages import *  # noqa: F401,F403
