"""Who registered each extension name: the one rule every registry follows (surrogates, advantage estimators,
verifiers, environments). Standard library only (the torch-free config check imports it).

A name belongs to the module that registered it first. The same module may register it again (a module
imported twice, by name and from its file, re-runs its decorators); any other module is refused with a message
naming both, so that a plug-in cannot replace a built-in (or another plug-in) for every arm of a comparison
while the run's config still names the original (verl's ``@register_adv_est`` without its silent overwrite).
"""

from __future__ import annotations

import sys
from typing import Optional

# (kind, name) -> (module, its file): the first registration of each name
_OWNERS: dict[tuple[str, str], tuple[str, Optional[str]]] = {}


def _file(module: str) -> Optional[str]:
    return getattr(sys.modules.get(module), "__file__", None)


def claim(kind: str, name: str, module: str) -> None:
    """Record that ``module`` registers the ``kind`` named ``name``; a ValueError naming both modules when another
    module holds that name already."""
    file = _file(module)
    old = _OWNERS.get((kind, name))
    if old is not None and old[0] != module and not (file and old[1] == file):
        raise ValueError(
            f"{kind} name {name!r} is registered already (by {old[0]}); {module} cannot register it again: "
            f"pick another name for yours"
        )
    _OWNERS[(kind, name)] = (module, file)


def owner(kind: str, name: str) -> Optional[str]:
    """The module that registered ``name`` (None: nobody)."""
    entry = _OWNERS.get((kind, name))
    return entry[0] if entry else None


def release(kind: str, name: str) -> None:
    """Forget ``name`` (a test's or a plug-in's own extension, taken out again)."""
    _OWNERS.pop((kind, name), None)


def caller_module(depth: int = 2) -> str:
    """The module that called the function calling this one (``depth`` frames up)."""
    return sys._getframe(depth).f_globals.get("__name__", "?")
