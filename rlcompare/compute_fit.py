"""Moved to rlcompare.report.compute_fit; kept as the documented import path (docs/api.md, the README's "Library API").

Code inside rlcompare imports rlcompare.report.compute_fit (tests/test_layers.py); monkeypatch that module, not this one.
"""

from rlcompare.report.compute_fit import *  # noqa: F401,F403
