"""What the Hydra app `rlcompare train` needs below the CLI: the conf/ folder, the run-name resolver and the
config node `surrogate_knobs` (every registered surrogate's knobs with their defaults, from their specs).

Moved here from `cli.py` (still importable from there): run, sweep, bench and precheck compose configs with them,
and importing the CLI from those made the cycle cli <-> run/sweep/bench.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from rlcompare.algos import surrogate_specs


def conf_dir() -> str:
    """conf/ next to the package (a source checkout), else the copy packaged inside it."""
    env = os.environ.get("RLCOMPARE_CONF")
    if env:
        return os.path.abspath(env)
    here = Path(__file__).resolve().parent.parent  # rlcompare/ (this file is rlcompare/train/app.py)
    for cand in (here.parent / "conf", here / "conf"):
        if (cand / "config.yaml").exists():
            return str(cand)
    raise FileNotFoundError("rlcompare could not find its conf/ folder; set RLCOMPARE_CONF")


_NAME_CACHE: dict[tuple, str] = {}
MAX_NAME = 120  # characters of a derived run name (a folder name: long ones are unreadable in listings)


def _short_values(overrides: str) -> str:
    """A path-valued override names the run by its last component: `model.name_or_path=/data/ckpt/qwen-sft`
    -> `model.name_or_path=qwen-sft` (the full path is in the run's config.yaml)."""
    items = []
    for item in overrides.split("__"):
        key, sep, value = item.partition("=")
        if sep and "/" in value.rstrip("/"):
            value = value.rstrip("/").rsplit("/", 1)[-1]
        items.append(key + sep + value)
    return "__".join(items)


def run_name(
    algorithm: str, seed, overrides: str, explicit=None, results_dir=None, experiment=None, resume=None
) -> str:
    """Run names say what ran (preset, key overrides, seed). A derived name that is taken by an earlier run
    gets a numeric suffix (`grpo__s0-2`), unless the run is being resumed; an explicit `run_name` is kept."""
    if explicit not in (None, "", "None", "null"):
        return str(explicit)
    key = (algorithm, str(seed), overrides or "", str(results_dir), str(experiment), str(resume))
    if key in _NAME_CACHE:  # Hydra resolves the run dir more than once: answer the same each time
        return _NAME_CACHE[key]
    parts = [algorithm] + ([_short_values(overrides)] if overrides else [])
    name, tail = re.sub(r"[^A-Za-z0-9._=,+\-]+", "_", "__".join(parts)), f"__s{seed}"
    if len(name) + len(tail) > MAX_NAME:  # cut, keep names of different override sets apart with a hash of them
        digest = hashlib.sha1("__".join([algorithm, overrides or "", str(seed)]).encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9 - len(tail)]}~{digest}"  # the seed stays visible after the hash
    name += tail
    resuming = str(resume).lower() not in ("false", "none", "0", "")
    if results_dir is not None and not resuming:
        base, n = name, 1
        while _name_taken(Path(str(results_dir)) / str(experiment) / name):
            n += 1
            name = f"{base}-{n}"
    elif results_dir is not None and str(resume).lower() in ("true", "1", "yes"):
        name = _run_to_resume(Path(str(results_dir)) / str(experiment), name)
    _NAME_CACHE[key] = name
    return name


def _run_to_resume(folder: Path, base: str) -> str:
    """resume=true under a derived name that earlier runs took more than once (`grpo__s0`, `grpo__s0-2`, ...: a
    second run of the same command got a suffix): the newest of them that has not completed, which is the one a
    user means to continue; when all completed, `base` (as with one run: nothing to do)."""
    pattern = re.compile(re.escape(base) + r"(?:-(\d{1,9}))?")
    try:
        found = [(m, p) for p in folder.iterdir() if (m := pattern.fullmatch(p.name)) and (p / "config.yaml").is_file()]
    except OSError:
        return base
    if len(found) < 2:
        return base
    unfinished = sorted((int(m.group(1) or 1), p.name) for m, p in found if not _completed(p))
    if not unfinished:
        return base
    chosen = unfinished[-1][1]
    others = sorted(p.name for _, p in found if p.name != chosen)
    print(
        f"[rlcompare] resume=true: {len(found)} runs named {base} in {folder} ({', '.join(others)} besides); "
        f"continuing {chosen}, the newest that has not completed (resume=<run dir> picks another)",
        file=sys.stderr,
    )
    return chosen


def _completed(run: Path) -> bool:
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(summary, dict) and summary.get("status") == "completed"


def _name_taken(folder: Path) -> bool:
    """A run folder is taken once it holds a run, or while a live process writes it (it locks the folder
    before it writes its config.yaml)."""
    if (folder / "config.yaml").exists():
        return True
    from rlcompare.train.run_lock import holder

    return holder(folder) is not None


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("rlc_run_name"):
        OmegaConf.register_new_resolver("rlc_run_name", run_name)


KNOBS_NODE = "surrogate_knobs"  # conf/config.yaml's first default: the presets' values override these


def _store_surrogate_knobs() -> None:
    """`algorithm.clip`'s keys at the schema's defaults (every registered surrogate's knobs with their specs'
    defaults, after the common ones), as the Hydra config node the composed config starts from: a preset lists only
    its own surrogate's knobs, yet every key is in the composed config, in the schema's order (a plain override
    `algorithm.clip.<knob>=v` works with any preset, and configs stay as they were). Stored again whenever a
    surrogate is registered."""
    from dataclasses import fields

    from hydra.core.config_store import ConfigStore

    from rlcompare.config.sections.algorithm import clip_config

    clip = {f.name: f.default for f in fields(clip_config())}
    # algorithm.module and verifier.module (a plug-in's module, config/user_modules.py) at their defaults, for every
    # preset: `verifier.module=x verifier.name=y` works on any verifier preset, as docs/config.md lists it
    node = {"algorithm": {"clip": clip, "module": None}, "verifier": {"module": None}}
    ConfigStore.instance().store(name=KNOBS_NODE, node=node)


surrogate_specs.on_change(_store_surrogate_knobs)
