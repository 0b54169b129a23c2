"""Importing a user's module by name: the verifier or surrogate a config names in `verifier.module` /
`algorithm.module` registers itself when imported. Standard library only (the torch-free config check uses it).

The console script `rlcompare` does not put the working directory on `sys.path` (`python -m` does), so a module
that is not found is looked for once more with the working directory last: `examples.near_miss` and
`examples.shifted_clip` load from the repository's root either way. That is for the modules of one's own config
(the command line's, a preset's, `resume=` of one's own run): while a folder someone else may have written is read
(`reading_as_data`: `rlcompare export`, a run folder as a teacher) no config-named module is imported at all.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

_READING: list[str] = []  # what is being read as data, innermost last (reading_as_data)


@contextlib.contextmanager
def reading_as_data(what: str):
    """Within the block, `import_by_name` refuses: a folder that is only read never runs a module it names."""
    _READING.append(what)
    try:
        yield
    finally:
        _READING.pop()


def import_by_name(module: str) -> None:
    """Import `module`; not found, once more with the working directory last on sys.path."""
    if _READING:
        raise ImportError(f"not imported: {_READING[-1]} reads a folder as data and runs no module it names")
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
