"""What changes what a run computes beyond its config: the external inputs, recorded in fingerprint.json and
summary.json (`inputs`), checked on resume, compared by the report.

A config names some things by a handle whose content can change under it: the teacher (`teacher.path`: a folder
whose weights can be replaced, a run folder that gains a checkpoint, a hub id whose revision moves) and plug-in
modules (`algorithm.module`, `verifier.module`, `env.module`, `env.target`'s module, a verifiers environment's
package). Two runs with the same config.yaml but another teacher behind one path, or another source behind one
module name, computed different things. `external_inputs(cfg)` is the one place that says what those inputs are now, keyed by
the config key that names each; `differences` says which changed between two records. Torch-free; hashing
reads the files, and nothing is imported that the run has not imported already.

Each entry: a module, `{"module", "source_sha256"}` (a package: every *.py under it); the verifiers environment,
`{"module", "distribution", "version", "source_sha256"}` and verifiers' own version; the teacher, `{"kind": "run",
"path", "checkpoint_step", "weights_sha256"}` for a run folder (the checkpoint it loads: the newest),
`{"kind": "folder", "path", "weights_sha256", "files_sha256"}` for a model folder (the safetensors files; the other
files: config, tokenizer), `{"kind": "hub", "id", "revision"}` for a hub id (the commit `teacher.revision` pins: a
hub teacher without one is refused before anything downloads, `teacher_check.check_hub_revision`). rlcompare's own modules are the code version (summary.json's provenance), not an input.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Optional

from rlcompare import env_specs
from rlcompare.config.operational import INPUT_LOCATIONS

_CHUNK = 1 << 20
_MAX_SOURCE_FILES = 10_000  # a package's *.py hashed at most (a source tree, not a disk)


def external_inputs(cfg: Any) -> dict:
    """{config key: what it names now} for every external input the config `cfg` uses (empty when none: the
    default config records nothing, so its fingerprint is as it was). Call after `validate(cfg)` (its modules
    imported): a module's source is read from the file it was imported from."""
    out: dict[str, dict] = {}
    for key, module in plugin_modules(cfg):
        out[key] = module_identity(module)
    env = _get(cfg, "env")
    spec = env_specs.of_config(_get(env, "name"), _get(env, "target")) if env is not None else None
    setting = spec.needs.package_setting if spec is not None else ""  # verifiers: the taskset's package
    package = str(_get(_get(env, "settings") or {}, setting) or "") if setting else ""
    if package:
        out[f"env.settings.{setting}"] = package_identity(package)
    teacher = _get(cfg, "teacher")
    if teacher is not None and _get(teacher, "path") is not None:
        out["teacher.path"] = teacher_identity(str(_get(teacher, "path")), _get(teacher, "revision"))
    return out


def plugin_modules(cfg: Any) -> list[tuple[str, str]]:
    """(config key, import name) of each user module the config imports: algorithm.module, verifier.module (and
    a weighted verifier's components'), env.module, env.target's module (rlcompare's own modules left out)."""
    found = []
    components = _select_dotted(cfg, "verifier.components") or []  # a weighted verifier's may name their own
    keys = ["algorithm.module", "verifier.module"]
    keys += [f"verifier.components.{i}.module" for i in range(len(components) if _is_list(components) else 0)]
    keys.append("env.module")
    for key in keys:
        value = _select_dotted(cfg, key)
        if isinstance(value, str) and value.strip() not in ("", "null", "None", "none"):
            found.append((key, value.strip()))
    target = _select_dotted(cfg, "env.target")
    if isinstance(target, str) and ":" in target:
        found.append(("env.target", target.partition(":")[0]))
    return [(k, m) for k, m in found if not (m == "rlcompare" or m.startswith("rlcompare."))]


def differences(then: dict, now: dict) -> list[str]:
    """'key field: then vs now' for every recorded field that changed (a key or field recorded in one record only
    counts). A field recorded as null then (unknown: a hub teacher not yet cached) is not compared, nor where an
    input lies (operational.INPUT_LOCATIONS: its content is compared)."""
    out = []
    for key in sorted(set(then) | set(now)):
        a, b = then.get(key), now.get(key)
        if a is None or b is None:
            out.append(
                f"{key}: {'not used' if a is None else 'used'} in the run, {'not used' if b is None else 'used'} now"
            )
            continue
        for field in sorted((set(a) | set(b)) - set(INPUT_LOCATIONS)):
            if a.get(field) is not None and a.get(field) != b.get(field):
                out.append(f"{key} {field}: {a.get(field)!r} in the run, {b.get(field)!r} now")
    return out


def recorded_inputs(run_dir: Path) -> Optional[dict]:
    """The external inputs a run folder's fingerprint.json records ({} when the run used none), or None when it has
    no readable fingerprint.json or one written before inputs were recorded (`inputs` absent: nothing to compare)."""
    from rlcompare.results import parse_json

    try:
        saved = parse_json((Path(run_dir) / "fingerprint.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or "inputs" not in saved:
        return None
    return saved["inputs"] if isinstance(saved["inputs"], dict) else None


# ----------------------------------------------------------------------------- modules
def module_identity(module: str) -> dict:
    """{"module", "source_sha256"} of an importable module (null hash when its source cannot be found)."""
    return {"module": module, "source_sha256": _files_hash(_source_files(module))}


def package_identity(module: str) -> dict:
    """A verifiers environment's package: its import name, installed distribution and version, source hash,
    and verifiers' own version (an environment package is run by it)."""
    dist, version = _distribution_of(module)
    return {
        "module": module,
        "distribution": dist,
        "version": version,
        "source_sha256": _files_hash(_source_files(module)),
        "verifiers": _version("verifiers"),
    }


def _source_files(module: str) -> list[Path]:
    """The source files of `module`: its file, or every *.py of its package (sorted); [] when not found. The
    module as imported (sys.modules) when it is; a top-level name is found without importing it."""
    loaded = sys.modules.get(module)
    spec = getattr(loaded, "__spec__", None) if loaded is not None else None
    if spec is None:
        if "." in module and module.rpartition(".")[0] not in sys.modules:
            return []  # finding it would import its parent package: not done here
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        files: list[Path] = []
        for root in spec.submodule_search_locations:
            files += sorted(Path(root).rglob("*.py"))[:_MAX_SOURCE_FILES]
        return files
    return [Path(spec.origin)] if spec.origin and os.path.isfile(spec.origin) else []


def _distribution_of(module: str) -> tuple[Optional[str], Optional[str]]:
    from importlib import metadata

    try:
        dists = metadata.packages_distributions().get(module.split(".")[0]) or []
    except Exception:  # noqa: BLE001 - a broken installation's metadata: unknown
        dists = []
    return (dists[0], _version(dists[0])) if dists else (None, None)


def _version(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - not installed
        return None


# ----------------------------------------------------------------------------- the teacher
def teacher_identity(path: str, revision: Optional[str] = None) -> dict:
    """What `teacher.path` names now: a run folder's newest checkpoint, a model folder's files, a hub id's commit
    (`teacher.revision`, which a hub teacher must give: `teacher_check.check_hub_revision`)."""
    from rlcompare.train.teacher_check import is_run_folder

    folder = Path(os.path.expanduser(path))
    if is_run_folder(path):
        step, state = newest_checkpoint(folder)
        return {
            "kind": "run",
            "path": str(folder.resolve()),
            "checkpoint_step": step,
            "weights_sha256": _files_hash([state] if state is not None else []),
        }
    if folder.is_dir():
        files = sorted(p for p in folder.iterdir() if p.is_file())
        return {
            "kind": "folder",
            "path": str(folder.resolve()),
            "weights_sha256": _files_hash([p for p in files if p.suffix == ".safetensors"]),
            "files_sha256": _files_hash([p for p in files if p.suffix != ".safetensors"]),
        }
    return {"kind": "hub", "id": path, "revision": revision or _cached_revision(path)}


def newest_checkpoint(run_dir: Path) -> tuple[Optional[int], Optional[Path]]:
    """(step, state file) of the run folder's newest complete checkpoint (checkpoints/step_<n>, renamed into place
    once written), or (None, None). The teacher loads this one and no other (`train.teacher`)."""
    from rlcompare.train.checkpoint_dirs import newest

    return newest(run_dir)


def _cached_revision(repo_id: str) -> Optional[str]:
    """The commit of `repo_id`'s snapshot in the local Hugging Face cache; None when not cached (or no hub lib)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id, no huggingface_hub
        return None
    if not isinstance(found, str):
        return None
    parts = Path(found).parts
    return parts[-2] if len(parts) >= 3 and parts[-3] == "snapshots" else None


def _files_hash(files: list[Path]) -> Optional[str]:
    """sha256 over each file's name (below the files' common folder) and bytes, in order (16 hex digits, as
    init_weights_hash); None for none."""
    if not files:
        return None
    base = Path(os.path.commonpath([str(p.parent) for p in files]))
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(base).as_posix().encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- reading a config or a dict alike
def _get(node: Any, key: str) -> Any:
    try:
        return node.get(key)
    except Exception:  # noqa: BLE001 - not a mapping
        return None


def _is_list(node: Any) -> bool:
    return isinstance(node, (list, tuple)) or type(node).__name__ == "ListConfig"


def _select_dotted(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node[int(part)] if part.isdigit() and _is_list(node) else _get(node, part)
        if node is None:
            return None
    return node


def check_teacher_loaded(used: dict, teacher: Any) -> None:
    """The teacher loaded is the one `used` records: a run folder that gained a checkpoint between the record and
    the load (its run still training) is refused, so fingerprint.json never names another teacher than the one
    that scored the run."""
    recorded = used.get("teacher.path") or {}
    if teacher is None or recorded.get("kind") != "run":
        return
    if teacher.checkpoint_step != recorded.get("checkpoint_step"):
        from rlcompare.config import ConfigError

        raise ConfigError(
            f"teacher.path={recorded.get('path')!r}: the run folder gained a checkpoint while this run started "
            f"(step {recorded.get('checkpoint_step')} recorded, step {teacher.checkpoint_step} loaded): its run is "
            f"still training. Give a teacher that does not change: `rlcompare export` it into a folder of its own"
        )
