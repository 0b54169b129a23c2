"""A run folder's config.yaml read as data: `rlcompare export <run>` and `teacher.path=<run folder>` read a folder
someone else may have written (a results folder from a colleague, a download), so nothing it names runs.

`validate` imports the modules a config names (`algorithm.module`, `verifier.module`, `env.module`, `env.target`'s
module): right for one's own run and for `resume=` (docs/resume), wrong for a folder that is only read. Here the
sections that name code or need it (algorithm, verifier, env, teacher) are replaced by the schema's defaults: what is read back is the
model (with `model.trust_remote_code` forced off), the prompts its warm start was trained on, the budget and the
sampling settings, which is all an export or a teacher needs. While such a folder is read, any import of a
config-named module is refused (`plugins.reading_as_data`), so a path that would still reach one fails loudly.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlcompare.config.checks import ConfigError
from rlcompare.config.schema import to_schema
from rlcompare.plugins import reading_as_data  # noqa: F401 - the block such a folder is read in (export, teacher)

# the config keys that name code to import, and the sections read back as the schema's defaults because of them
CODE_KEYS = ("algorithm.module", "verifier.module", "env.module", "env.target")
AS_DEFAULTS = ("algorithm", "verifier", "env", "teacher")


def read_run_config(path: Path | str, what: str) -> DictConfig:
    """The config.yaml at `path`, typed by the schema, with AS_DEFAULTS replaced by defaults and
    model.trust_remote_code off; nothing imported. `what` names the reader in errors (e.g. "export")."""
    path = Path(path)
    try:
        raw = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - not YAML, not a mapping, unreadable
        raise ConfigError(f"{what}: {path} could not be read ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{what}: {path} is not a mapping of settings; give a run folder's config.yaml")
    interpolated = _interpolations(raw)
    if interpolated:  # a run writes its config resolved: an interpolation was put there by hand
        raise ConfigError(
            f"{what}: {path} holds interpolations ({', '.join(interpolated[:3])}); a run folder's config.yaml is "
            f"written resolved, so this one was edited: give the run folder as rlcompare wrote it"
        )
    data = OmegaConf.to_container(raw, resolve=False)
    for section in AS_DEFAULTS:
        data.pop(section, None)
    if isinstance(data.get("model"), dict):
        data["model"]["trust_remote_code"] = False  # a foreign folder's model code never runs
    return to_schema(data)


def _interpolations(node, prefix: str = "") -> list[str]:
    """Dotted keys of `node` whose value is an interpolation (`${...}`), without resolving any."""
    found = []
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        where = f"{prefix}{key}"
        if OmegaConf.is_interpolation(node, key):
            found.append(where)
            continue
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and not child._is_none():
            found += _interpolations(child, where + ".")
    return found
