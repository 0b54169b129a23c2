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
