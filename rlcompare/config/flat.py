"""Nested dicts as flat dotted keys: how configs and fingerprints are diffed (no dependencies)."""

from __future__ import annotations

from typing import Any


def flatten(d: Any, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and empty dicts are leaves."""
    out: dict = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                out.update(flatten(v, key + "."))
            else:
                out[key] = v
    return out
