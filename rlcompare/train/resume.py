"""Resume: continuing a run folder from its newest checkpoint, with every step exactly once.

`resume=true` (same overrides) or `resume=<run dir>`: the config is checked against the run's (only the keys in
RESUME_IGNORED may differ; a differing key is named with both values), the newest usable checkpoint at or below
the last contiguous metrics row is read before the model loads, then loaded, and rows after it are dropped from
metrics/eval/samples/eval_counts.jsonl (a torn last line too). On the CPU the resumed rows equal an uninterrupted
run's (timing columns aside). With no checkpoint yet the run restarts cleanly; when it has checkpoints but none
can be read, it is refused (nothing is deleted). `train.run` calls these in that order.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlcompare.config import ConfigError, operational, to_schema, validate
from rlcompare.config.flat import flatten
from rlcompare.train import checkpoint
from rlcompare.train.tracking import atomic_write_json, atomic_write_text, parse_json, read_jsonl, truncate_jsonl

ROW_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl", "eval_counts.jsonl")


# Keys that may differ between a run and its resumption: how it runs, not what it computes (rlcompare.config.operational,
# with each key's reason). None of them is in a derived run name, so changing one keeps the run's folder.
RESUME_IGNORED = operational.RESUME_IGNORED


class ResumeRefused(ConfigError):
    """The checkpoint to resume from does not fit this run: refused before anything of it loaded, and the run
    folder's files are left as they were."""


def run_files(run_dir: Path) -> dict[str, str | None]:
    """config.yaml and summary.json as they are now (None: absent or unreadable), for `put_back`."""
    out: dict[str, str | None] = {}
    for name in ("config.yaml", "summary.json"):
        try:
            out[name] = (run_dir / name).read_text()
        except (OSError, ValueError):
            out[name] = None
    return out


def put_back(run_dir: Path, files: dict[str, str | None]) -> None:
    for name, text in files.items():
        if text is not None:
            atomic_write_text(run_dir / name, text)


def budget_spent(cfg, step: int, tokens: int) -> bool:
    b = cfg.budget
    if b.max_steps is not None and step >= b.max_steps:
        return True
    return b.total_tokens is not None and tokens >= b.total_tokens


def resume_requested(cfg) -> bool:
    r = cfg.resume
    return r is True or (isinstance(r, str) and r.lower() not in ("false", "0", "no", ""))


def resume_is_path(cfg) -> bool:
    r = cfg.resume
    return isinstance(r, str) and r.lower() not in ("true", "false", "0", "1", "no", "yes", "")


def _saved_config(run_dir: Path) -> DictConfig:
    saved_path = run_dir / "config.yaml"
    if not saved_path.exists():
        raise ConfigError(f"resume: {run_dir} holds no config.yaml; it is not a run folder")
    try:
        saved_cfg = OmegaConf.load(saved_path)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"resume: {saved_path} could not be read ({e}); start a new run") from None
    try:  # fill keys the schema gained since the run started with their defaults
        saved_cfg = to_schema(saved_cfg)
    except ConfigError:
        pass
    return saved_cfg


def _check_resume_config(run_dir: Path, cfg: DictConfig, only: set[str] | None = None) -> None:
    """A resumed run must compute what the original computed: any differing key (but RESUME_IGNORED) fails, named.

    `only`: compare just these keys (those the command line set explicitly, for resume=<run dir>)."""
    saved = flatten(OmegaConf.to_container(_saved_config(run_dir), resolve=True))
    now = flatten(OmegaConf.to_container(cfg, resolve=True))
    diffs = _differing_keys(saved, now, only)
    if diffs:
        raise ConfigError(
            f"resume: the config differs from the run being resumed in: {', '.join(diffs)} "
            f"({_shown_diffs(saved, now, diffs)}); resume with the same overrides, or start a new run. "
            f"Only these keys may differ on resume: {', '.join(sorted(RESUME_IGNORED))}"
        )


def _differing_keys(saved: dict, now: dict, only: set[str] | None = None) -> list[str]:
    """Flattened keys whose values differ (absent counts), but those in RESUME_IGNORED; `only`: just these keys."""
    keys = set(saved) | set(now)
    if only is not None:
        keys = {k for k in keys if any(k == o or k.startswith(o + ".") for o in only)}
    return sorted(k for k in keys if k not in RESUME_IGNORED and saved.get(k) != now.get(k))


def _shown_diffs(saved: dict, now: dict, diffs: list[str]) -> str:
    shown = "; ".join(
        f"{k}: {saved.get(k, '<absent>')!r} in the run, {now.get(k, '<absent>')!r} now" for k in diffs[:8]
    )
    return shown + (f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else "")


def refuse_resuming_another_run(cfg: DictConfig, run_dir: Path) -> None:
    """resume=true under a derived run name that names no run: the settings differ from the run meant to be
    continued (its name would be this one otherwise). When the experiment folder holds runs of the same preset
    and seed, refuse, naming how the closest one differs, instead of silently starting a new run."""
    if cfg.run_name not in (None, "") or resume_is_path(cfg) or (run_dir / "config.yaml").exists():
        return
    now = flatten(OmegaConf.to_container(cfg, resolve=True))
    closest = None
    for other in _same_preset_and_seed(run_dir.parent, cfg, exclude=run_dir):
        try:
            saved = flatten(OmegaConf.to_container(_saved_config(other), resolve=True))
        except ConfigError:
            continue
        diffs = _differing_keys(saved, now)
        if closest is None or len(diffs) < len(closest[2]):
            closest = (other, saved, diffs)
    if closest is None:
        return
    other, saved, diffs = closest
    _drop_hydra_only_folder(run_dir)
    how = (
        f"differs in: {', '.join(diffs)} ({_shown_diffs(saved, now, diffs)})"
        if diffs
        else "differs only in keys that may change on resume (its name predates them being left out of names)"
    )
    raise ConfigError(
        f"resume=true: no run named {run_dir.name} in {run_dir.parent}, so nothing with these settings "
        f"can be continued. The run there with the same preset and seed closest to them, {other.name}, "
        f"{how}. To continue it, give the overrides it was started with, or resume={other}; to start "
        f"a new run with these settings, leave out resume=true. Only these keys may differ on resume: "
        f"{', '.join(sorted(RESUME_IGNORED))}"
    )


def _same_preset_and_seed(folder: Path, cfg: DictConfig, exclude: Path) -> list[Path]:
    """Run folders in `folder` (their summary.json, else config.yaml, says so) with cfg's preset and seed."""
    found = []
    try:
        children = sorted(p for p in folder.iterdir() if p.is_dir() and p != exclude)
    except OSError:
        return found
    for d in children:
        if not (d / "config.yaml").is_file():
            continue
        try:
            s = parse_json((d / "summary.json").read_text())
            algo, seed = s.get("algorithm"), s.get("seed")
        except (OSError, ValueError, AttributeError):
            try:
                c = OmegaConf.load(d / "config.yaml")
                algo, seed = OmegaConf.select(c, "algorithm.name"), OmegaConf.select(c, "seed")
            except Exception:  # noqa: BLE001 - not a readable run folder
                continue
        if algo == cfg.algorithm.name and seed == cfg.seed:
            found.append(d)
    return found


def _drop_hydra_only_folder(run_dir: Path) -> None:
    """A run refused before it wrote anything: remove the folder Hydra made for it (only Hydra's files in it)."""
    try:
        if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".hydra", "train.log"}:
            shutil.rmtree(run_dir, ignore_errors=True)
    except OSError:
        pass


def checkpoint_to_resume(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest usable checkpoint at or below the last contiguous metrics row, read (not yet loaded); None when
    the run has none. Checkpoints that are all unusable refuse the resume, so a run is never silently restarted."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    done = _contiguous_steps(rows)
    tokens_at = {r["step"]: r.get("tokens/generated") for r in rows[:done]}
    try:
        return checkpoint.read_latest(run_dir, max_step=done, tokens_at=tokens_at)
    except checkpoint.NoUsableCheckpoint as e:
        raise ConfigError(
            f"resume: none of the checkpoints in {run_dir / 'checkpoints'} can be resumed from ({e}); "
            f"nothing was changed. To start this run over from step 0, move or delete {run_dir} and run "
            f"the same command without resume=true; or keep it and start a new run with "
            f"run_name=<another name>"
        ) from None


def check_inputs(run_dir: Path, now: dict) -> None:
    """Resuming from a checkpoint: the external inputs (`rlcompare.train.inputs`: the teacher, plug-in modules'
    source) must be those fingerprint.json recorded when the run started, or its rows would mix two setups under
    one config. A change is refused naming it; a fingerprint from before inputs were recorded is said so."""
    from rlcompare.train.inputs import differences, recorded_inputs

    saved = recorded_inputs(run_dir)
    if saved is None:
        if now:
            print(
                f"[rlcompare] resume: {run_dir}/fingerprint.json records no external inputs (written before they "
                f"were recorded, or missing): {', '.join(now)} cannot be checked against the run's start",
                file=sys.stderr,
            )
        return
    changed = differences(saved, now)
    if changed:
        raise ConfigError(
            f"resume: an input of {run_dir.name} changed since it started: {'; '.join(changed[:6])}. Its rows so "
            f"far were computed with the old one; put it back as it was (the teacher folder's files or checkpoints, "
            f"the module's source) to continue, or start a new run with run_name=<another name>"
        )


def print_imported_modules(run_dir: Path, what: str) -> None:
    """`resume=<run dir>` imports the modules the run's config.yaml names (its surrogate, verifier, environment):
    by design, since the run computed with them; said on stderr before the import, naming each."""
    from rlcompare.train.inputs import plugin_modules

    try:
        modules = plugin_modules(OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=False))
    except Exception:  # noqa: BLE001 - an unreadable config.yaml: _saved_config names it
        return
    if modules:
        names = ", ".join(f"{key}={module}" for key, module in modules)
        print(
            f"[rlcompare] {what}: importing the modules {run_dir}/config.yaml names: {names} (their code runs; "
            f"resume only runs you trust)",
            file=sys.stderr,
        )


def _command_line_keys() -> set[str] | None:
    """Keys (and config groups) set on the command line of this Hydra run, without the operational ones;
    None when not run by Hydra (train() called with a composed config)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        task = list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        from rlcompare.train.app import conf_dir

        groups = {p.name for p in Path(conf_dir()).iterdir() if p.is_dir()}
    except Exception:  # noqa: BLE001
        groups = set()
    keys = set()
    for o in OverridesParser.create().parse_overrides(task):
        key = o.key_or_group
        if key.startswith("hydra") or key in RESUME_IGNORED:
            continue
        keys.add(f"{key}.name" if key in groups else key)  # a preset: compare which one (its name), not every knob
    return keys


def _config_for_resume_from(run_dir: Path, cfg: DictConfig) -> DictConfig:
    """resume=<run dir> from the command line: the run's own config, with the operational keys (RESUME_IGNORED)
    from the command line. Settings given explicitly on the command line must agree with the run's."""
    only = _command_line_keys()
    if only is None:  # a full config was passed in: it must be the run's
        _check_resume_config(run_dir, cfg)
        return cfg
    _check_resume_config(run_dir, cfg, only=only)
    saved = _saved_config(run_dir)
    for key in RESUME_IGNORED:
        if OmegaConf.select(cfg, key, default="__absent__") != "__absent__":
            OmegaConf.update(saved, key, OmegaConf.select(cfg, key), merge=False, force_add=True)
    return validate(saved)


def _completed_summary(run_dir: Path, cfg) -> dict | None:
    """The summary of a run that completed its budget (its rows say so too), else None."""
    try:
        s = parse_json((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(s, dict) or s.get("status") != "completed":
        return None
    rows = read_jsonl(run_dir / "metrics.jsonl")
    n = _contiguous_steps(rows)
    if n == 0 or n != len(rows) or n != s.get("steps"):
        return None
    return s if budget_spent(cfg, n, rows[-1].get("tokens/generated") or 0) else None


def _contiguous_steps(rows: list[dict]) -> int:
    """The largest n such that rows hold steps 1..n, each once, in order."""
    n = 0
    for r in rows:
        if r.get("step") != n + 1:
            break
        n += 1
    return n


def check_folder(cfg: DictConfig, run_dir: Path, resuming: bool) -> tuple[DictConfig, dict | None]:
    """The run folder against the command: a resume's config checks (resume=<dir> takes the run's own config),
    an occupied folder refused. Returns the config to run and, when a resumed run had already completed its
    budget, its summary (nothing left to do)."""
    if not resuming:
        if read_jsonl(run_dir / "metrics.jsonl"):
            raise ConfigError(
                f"{run_dir} already holds a run; pass resume=true to continue it, or set "
                f"run_name/experiment for a new one"
            )
        return cfg, None
    if not (run_dir / "config.yaml").exists():
        if resume_is_path(cfg):
            raise ConfigError(f"resume: {run_dir} holds no config.yaml; it is not a run folder")
        print(f"[rlcompare] resume=true: no run in {run_dir} yet; starting a new one", file=sys.stderr)
        return cfg, None
    if resume_is_path(cfg):
        _drop_stray_hydra_dir(run_dir)
        print_imported_modules(run_dir, f"resume={cfg.resume}")
        cfg = _config_for_resume_from(run_dir, cfg)
    else:
        _check_resume_config(run_dir, cfg)
    done = _completed_summary(run_dir, cfg)
    if done is not None:
        done = {**done, "run_dir": str(run_dir), "run_name": run_dir.name}  # a copied run folder: the copy
        print(
            f"[rlcompare] resume: {run_dir} already completed its budget ({done.get('steps')} steps); nothing to do",
            file=sys.stderr,
        )
        atomic_write_json(run_dir / "summary.json", done)
    return cfg, done


def restore(tr, run_dir: Path, found: tuple[Path, dict] | None, resuming: bool) -> Path | None:
    """Load the checkpoint to resume from (and drop the rows written after it), or clear a fresh run's leftovers.
    Returns the checkpoint loaded, or None."""
    if found is None:
        if resuming:
            tr.log(f"[rlcompare] resume: no checkpoint in {run_dir}; starting the run from the beginning")
        _clear_run_outputs(run_dir)
        return None
    ckpt, blob = found
    try:
        checkpoint.load(tr, ckpt, blob)
    except (RuntimeError, KeyError, TypeError, ValueError) as e:  # read back, but not this run's
        raise ResumeRefused(
            f"resume: checkpoint {ckpt} does not fit this run ({type(e).__name__}: {str(e)[:300]}); "
            f"its rows and checkpoints are kept. Start a new run with run_name=<another name>"
        ) from None
    step = tr.state.step
    tr.log(f"[rlcompare] resuming {run_dir} from step {step} ({ckpt.name})")
    for name in ROW_FILES:
        dropped = truncate_jsonl(run_dir / name, lambda r: r.get("step", 0) <= step)
        if dropped:
            tr.log(f"[rlcompare] {name}: dropped {dropped} row(s) written after the checkpoint")
    return ckpt


def _drop_stray_hydra_dir(run_dir: Path) -> None:
    """`rlcompare train resume=<run dir>`: Hydra made an output folder for this command before train() ran; when it
    is not the run folder and holds only Hydra's own files, remove it (the run continues in <run dir>)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return
        out = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001
        return
    if out.resolve() == Path(run_dir).resolve() or not out.is_dir():
        return
    if {p.name for p in out.iterdir()} <= {".hydra", "train.log"}:
        shutil.rmtree(out, ignore_errors=True)


def _clear_run_outputs(run_dir: Path) -> None:
    """Starting from step 0 in a folder that may hold leftovers (a run killed before its first checkpoint)."""
    for name in (*ROW_FILES, "wandb_id.txt", "fingerprint.json"):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
