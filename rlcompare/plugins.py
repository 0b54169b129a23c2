"""Importing a user's module by name: the verifier or surrogate a config names in `verifier.module` /
`algorithm.module` registers itself when imported. Standard library only (the torch-free config check uses it).

The console script `rlcompare` does not put the working directory on `sys.path` (`python -m` does), so a module
that is not found is looked for once more with the working directory last: `examples.near_miss` and
`examples.shifted_clip` load from the repository's root either way.
"""

from __future__ import annotations

import importlib
import os
import sys


def import_by_name(module: str) -> None:
    """Import `module`; not found, once more with the working directory last on sys.path."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        if here in sys.path or not (e.name and module.startswith(e.name)):
            raise
        sys.path.append(here)
        importlib.import_module(module)


def import_registering(key: str, module, registers: str) -> None:
    """Import the module a config's `key` names, which registers `registers`; a ValueError naming the key, the
    failure and the fix when it cannot be imported (the user's code may raise anything)."""
    try:
        import_by_name(str(module))
    except Exception as e:  # noqa: BLE001 - any failure of the user's module, named
        raise ValueError(
            f"{key}={module!r} cannot be imported ({type(e).__name__}: {e}); give the importable name of the "
            f"module that registers {registers}, or null for a built-in"
        ) from None
