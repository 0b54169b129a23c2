"""How an environment is built, in the worker that steps it (rlcompare.envs.runner): what a config names
(`env.name`, `env.settings`, and for env.name=custom `env.target`) as plain data a worker can receive, then the
factory that data names, called with the settings.

A registered environment (rlcompare/env_specs.py: the built-ins, and those an `env.module` registers) is resolved
in the trainer's process, where its spec is registered: its factory ("module:attribute") and its settings with
every default filled in. The worker imports the factory's module by name (a fresh interpreter: it has no registry
of its own), so a plug-in's module must be importable there too (the working directory is on its path).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlcompare import env_specs
from rlcompare.envs.base import Environment


def worker_spec(config: Mapping) -> dict:
    """`{"name", "target", "settings"}` of the environment `config` names (`env.name`, `env.target`,
    `env.settings` as plain data): a registered name's factory and checked settings (defaults filled in); a
    custom target as given."""
    name, settings = config.get("name"), dict(config.get("settings") or {})
    if name == env_specs.CUSTOM or name not in env_specs.SPECS:
        return {"name": name, "target": config.get("target"), "settings": settings}
    spec = env_specs.SPECS[name]
    return {"name": name, "target": spec.factory, "settings": spec.factory_kwargs(spec.settings_of(settings))}


def build(spec: Mapping) -> Environment:
    """One episode's environment: `spec["target"]` called with `spec["settings"]` (a `worker_spec`)."""
    return env_specs.resolve_factory(spec["target"])(**dict(spec.get("settings") or {}))
