"""Moved to rlcompare.report.stats; kept as the documented import path (docs/api.md, the README's "Library API").

Code inside rlcompare imports rlcompare.report.stats (tests/test_layers.py); monkeypatch that module, not this one.
"""

from rlcompare.report.stats import *  # noqa: F401,F403
