"""`algorithm.module`: the user's module that registers a surrogate (`@register_surrogate`, docs/api.md "Adding a
surrogate"), imported before a config that names it is composed and checked.

Why before composing: a plug-in surrogate's knobs are keys of `algorithm.clip` only once its spec is registered
(the Hydra node `surrogate_knobs` and the schema are built from the registry), so `algorithm.clip.<knob>=v` on a
command line composes only after the import. `rlcompare train` and `rlcompare sweep` import the modules their
overrides name first (`import_modules_in_overrides`); `validate` imports the config's own `algorithm.module`
(a preset's, a resumed run's saved config, a rank's), so every process that checks a config has the surrogate.
Hydra's launchers hand their workers the parent's config store, knobs included. Standard library only.
"""

from __future__ import annotations

import re

from rlcompare.plugins import import_registering

KEY = "algorithm.module"
_OVERRIDE = re.compile(r"\+{0,2}algorithm\.module=(.*)", re.S)
_NULLS = ("", "null", "None", "none")


def import_surrogate_module(module) -> None:
    """Import `module` (null: nothing); a ValueError naming `algorithm.module` and the fix when it cannot be."""
    import_setting_module(
        KEY,
        module,
        "the surrogate (@register_surrogate; a module under the working directory, e.g. examples.shifted_clip "
        "from the repository's root, or an installed one)",
        "examples.shifted_clip",
    )


def import_setting_module(key: str, module, registers: str, example: str) -> None:
    """Import the module a `*.module` setting names (null: nothing): `registers` says what it registers,
    `example` an import name; a ValueError naming `key` and the fix when it cannot be imported."""
    if module is None or (isinstance(module, str) and module.strip() in _NULLS):
        return
    if not isinstance(module, str):
        raise ValueError(
            f"{key}={module!r}: give the import name of the module that registers {registers.split(' (')[0]} "
            f"(e.g. {key}={example}), or null for a built-in"
        )
    import_registering(key, module.strip(), registers)


def modules_in_overrides(overrides) -> list[str]:
    """The modules `algorithm.module=...` names in Hydra overrides, in order (a multirun's `a,b` names both)."""
    out: list[str] = []
    for o in overrides:
        m = _OVERRIDE.fullmatch(str(o))
        if m is None:
            continue
        for value in m.group(1).split(","):  # an import name holds no comma: a comma separates a multirun's values
            value = value.strip().strip("'\"").strip()
            if value not in _NULLS and value not in out:
                out.append(value)
    return out


def import_modules_in_overrides(overrides) -> None:
    """Import every module `algorithm.module=...` names in `overrides` (before Hydra composes them)."""
    for module in modules_in_overrides(overrides):
        import_surrogate_module(module)
