"""A run that stopped on an error raised inside a plug-in module the config names: the error said in one line.

A plug-in surrogate (`algorithm.module`, docs/api.md "Adding a surrogate") or verifier (`verifier.module`) is the
user's code, called from deep inside the update. When it raises, a traceback through rlcompare and Hydra hides
the one fact the user needs: their module raised, where, and what. `plugin_failure` finds the innermost frame of
the error in a file of such a module and says it in one line (summary.json's `error`, train.log, the CLI's
message); the CLI exits 1 without a traceback (`PluginFailed`).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Optional

_NULLS = (None, "", "null", "None", "none")


class PluginFailed(RuntimeError):
    """The run stopped because a plug-in module raised; the message names the module, the key and the error."""


def _module_file(name: str) -> Optional[str]:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path else None


def _plugins(cfg) -> list[tuple[str, str, str]]:
    """(key, module name, what it registers) for each plug-in module the config names."""
    out = []
    for key, what in (("algorithm", "surrogate"), ("verifier", "verifier")):
        section = cfg.get(key) if hasattr(cfg, "get") else None
        module = section.get("module") if section is not None and hasattr(section, "get") else None
        if module not in _NULLS:
            name = section.get("surrogate") if key == "algorithm" else section.get("name")
            out.append((f"{key}.module", str(module), f"the {what} {str(name)!r}"))
    return out


def _within(filename: str, path: str, package: Optional[str]) -> bool:
    return filename == path or (package is not None and filename.startswith(package))


def plugin_failure(cfg, error: BaseException) -> Optional[str]:
    """One line naming the plug-in module whose code raised `error` (its innermost frame in one of the config's
    plug-in modules), the error and where; None when the error did not come from one."""
    if not isinstance(error, Exception):
        return None
    try:
        plugins = _plugins(cfg)
    except Exception:  # noqa: BLE001 - a malformed config: no plug-in to blame
        return None
    if not plugins:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    for key, module, what in plugins:
        path = _module_file(module)
        if path is None:
            continue
        package = os.path.dirname(path) + os.sep if os.path.basename(path) == "__init__.py" else None
        inside = [f for f in frames if _within(os.path.realpath(f.filename), path, package)]
        if inside:
            where = inside[-1]
            return (
                f"{what} ({key}={module}) raised {type(error).__name__}: {error} (at {where.filename}:{where.lineno}, "
                f"in {where.name}); fix the module or run with {key}=null and a built-in"
            )
    return None
