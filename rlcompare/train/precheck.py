"""`rlcompare train`'s check of its command line, before Hydra runs it and before torch is imported.

Hydra creates the run folder (`hydra.run.dir`, or `hydra.sweep.dir` in a multirun) before the job function runs,
and the job function imports torch and transformers (about 3 s) before `train()` validates. So a bad value used to
leave a folder behind, take 4 s to report, and an uncreatable `results_dir` gave Hydra's raw `mkdir` traceback.
Here each job of the command line is composed with Hydra's compose API (the same config Hydra will compose),
validated with `rlcompare.config.validate`, its verifier built and (for local prompt sets and inline verifiers)
probed with the prompts (`rlcompare.train.verifier_probe`), and its run folder checked creatable; the first error comes
back as one line naming the key. `train()` validates again inside the job (it is also called without the CLI).

Command lines this cannot compose exactly as Hydra will are left to Hydra and `train()`: informational flags
(`--help`, `--cfg`, `--info`, ...), another config source (`--config-dir`, `--config-name`), another sweeper or
launcher plugin, and `resume=<run dir>` (train() checks the run's own saved config).
"""

from __future__ import annotations

import re

MODE_FLAGS = {"-m": True, "--multirun": True, "-r": False, "--run": False}  # flag -> multirun
MAX_JOBS_CHECKED = 64  # jobs of a multirun composed here (a compose each); the rest are checked in their job
PLUGIN_GROUPS = ("hydra/sweeper", "hydra/launcher", "hydra.sweeper", "hydra.launcher")


def check_train_args(argv: list[str]) -> str | None:
    """The first config error (one line) of the jobs `rlcompare train argv` would run, or None when every job
    checked passes or the command line is one to leave to Hydra (see the module doc)."""
    multirun = any(MODE_FLAGS.get(a) for a in argv)
    if any(a.startswith("-") and a not in MODE_FLAGS for a in argv):
        return None
    overrides = [a for a in argv if a not in MODE_FLAGS]
    parsed, err = _parse(overrides)
    if err is not None:
        return err
    if multirun and any(o.key_or_group.startswith(PLUGIN_GROUPS) for o in parsed):
        return None
    jobs = _jobs(parsed) if multirun else [overrides]
    probed: set[str] = set()  # (prompts, verifier) settings probed already: seeds of a sweep share them
    for job in jobs[:MAX_JOBS_CHECKED]:
        try:
            err = check_job(job, multirun=multirun, probed=probed)
        except Exception:  # noqa: BLE001 - a fault of this check must not block a run: train() checks again
            return None
        if err is not None:
            return f"{err} (multirun job {' '.join(job)})" if multirun and len(jobs) > 1 else err
    return None


def _parse(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for o in overrides:  # one at a time, to name the one Hydra cannot read
        try:
            parser.parse_overrides([o])
        except OverrideParseException as e:
            return None, (
                f"{o}: Hydra cannot parse this override ({_one_line(str(e))}); quote values holding "
                f"spaces or special characters, e.g. 'key=\"a value\"'"
            )
    return parser.parse_overrides(overrides), None


def _jobs(parsed) -> list[list[str]]:
    """The jobs of a multirun, each as its list of overrides, as Hydra's basic sweeper splits them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def check_job(overrides: list[str], multirun: bool = False, probed: set[str] | None = None) -> str | None:
    """Compose one job's config as Hydra will, validate it and check its run folder; the error (one line) or None."""
    from hydra import compose, initialize_config_dir

    from rlcompare.train.app import conf_dir, register_resolvers
    from rlcompare.config import ConfigError, validate

    register_resolvers()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base=None, job_name="train"):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    except Exception as e:  # noqa: BLE001 - unknown preset, key not in the config, a sweep without -m, ...
        return _composition_error(e, overrides)
    if _resumes_a_folder(cfg):  # train() checks it against that run's own config, not this composed one
        return None
    try:
        checked = validate(cfg)
        _check_model_folder(checked)
        if checked.teacher.path is not None:  # the folder, the device and the tokenizer against the student's
            from rlcompare.train.teacher_check import check_teacher

            check_teacher(checked)
        _check_prompts_and_verifier(checked, set() if probed is None else probed)
        from rlcompare.train.env_room import check_env_room

        check_env_room(checked)  # a tool-use environment's turns hold a call (a tokenizer's load, for env=calc)
        from rlcompare.train.model_folder import check_chat_template

        check_chat_template(checked)  # after the prompt set's own settings: those errors name the key to fix first
    except ConfigError as e:
        return str(e)
    key, folder = _run_folder(cfg, overrides, multirun)
    if folder is not None:
        try:
            from rlcompare.config import check_creatable

            check_creatable(key, folder)
        except ConfigError as e:
            return str(e)
    return None


def _resumes_a_folder(cfg) -> bool:
    r = cfg.get("resume")
    return isinstance(r, str) and r.strip().lower() not in ("true", "false", "0", "1", "no", "yes", "")


def _check_model_folder(cfg) -> None:
    """A local model folder: no code to run without trust_remote_code, no pickle-only weights, safetensors headers
    that read (rlcompare.train.model_folder), before Hydra makes the run folder."""
    from rlcompare.train.model_folder import check_model

    check_model(cfg.model)


def _check_prompts_and_verifier(cfg, probed: set[str]) -> None:
    """Build the verifier (a misspelt name, a bad pattern) and, for prompt sets made or read locally, the prompts,
    and probe the verifier with them when it scores inline (rlcompare.train.verifier_probe). A hub prompt set (a download)
    and a verifier in worker processes (math-verify: seconds to start) are checked in the job's preflight only."""
    from omegaconf import OmegaConf

    from rlcompare.train.verifier_probe import build_prompt_set, build_run_verifier, check_verifier_reads_prompts

    both = OmegaConf.to_yaml(cfg.prompts) + OmegaConf.to_yaml(cfg.verifier)
    if both in probed:
        return
    probed.add(both)
    if cfg.prompts.kind == "hf":  # the download is the job's; the package it needs is checked before the folder
        _check_hub_package()
    if cfg.prompts.kind == "reasoning_gym":  # its verifier runs in workers, so the probe below skips its prompts
        _check_gym_settings(cfg.prompts)
    verifier = build_run_verifier(cfg)
    try:
        inline = verifier.isolation == "inline" or (verifier.isolation == "auto" and verifier.bounded)
        if cfg.prompts.kind != "hf" and inline:
            check_verifier_reads_prompts(cfg, build_prompt_set(cfg), verifier)  # a warning is printed by the job
    finally:
        verifier.close()


def _check_hub_package() -> None:
    import importlib.util

    from rlcompare.config import ConfigError
    from rlcompare.data.datasets import NO_DATASETS

    if importlib.util.find_spec("datasets") is None:
        raise ConfigError(NO_DATASETS)


def _check_gym_settings(prompts) -> None:
    """The dataset's name, its task_config and the split seeds, refused before Hydra makes the run folder (one entry
    generated, not the whole split: the job builds that)."""
    from rlcompare.config import ConfigError
    from rlcompare.data.gym_tasks import check_gym_settings

    try:
        check_gym_settings(prompts)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _run_folder(cfg, overrides: list[str], multirun: bool) -> tuple[str, str | None]:
    """(the key that places it, the folder Hydra will create for this job); None when it cannot be resolved here
    (an interpolation of Hydra's job runtime, e.g. ${hydra:job.num}): Hydra reports that itself."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    keys = ("hydra.sweep.dir",) if multirun else ("hydra.run.dir",)
    given = next((k for k in keys if any(o.startswith(k + "=") for o in overrides)), None)
    instance = HydraConfig.instance()
    try:
        instance.set_config(cfg)
        folder = str(OmegaConf.select(cfg, keys[0]))
    except Exception:  # noqa: BLE001
        return keys[0], None
    finally:
        instance.cfg = None  # Hydra sets it again for the real job
    return (given or "results_dir"), folder


def _composition_error(e: Exception, overrides: list[str]) -> str:
    """Hydra's composition error as one line starting with the override it is about."""
    msg = "; ".join(_one_line(str(x)) for x in (e, e.__cause__) if x is not None and str(x).strip())
    missing = getattr(e, "missing_cfg_file", None)  # `algorithm=nope`: Hydra lists the options of the group
    key = str(missing).rsplit("/", 1)[0] if missing else None
    if key is None:
        m = re.search(r"override '([^']+)'|argument '([^'=]+)", msg)
        key = next((g for g in m.groups() if g), None) if m else None
    culprit = next((o for o in overrides if key and o.split("=", 1)[0].lstrip("+~") == key), None)
    if culprit and "not in struct" in msg and not _in_schema(key):
        return f"{culprit}: unknown config key '{key}' (Hydra: {msg.rsplit('; ', 1)[-1]}){_accepted_keys(key)}"
    if culprit and "not in struct" in msg and key.startswith("model."):
        return _other_models_key(culprit, key, overrides)
    return f"{culprit + ': ' if culprit else ''}{msg}"


HF_ONLY_FIX = {"model.lora": "LoRA adapters are for pretrained models: the tiny model trains every weight"}


def _other_models_key(culprit: str, key: str, overrides: list[str]) -> str:
    """A model key of another model preset (`model.lora.enabled=true` with the default model=tiny): which preset has
    it and the fix, instead of Hydra's 'not in struct'."""
    preset = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == "model"), "tiny")
    why = next((w for k, w in HF_ONLY_FIX.items() if key == k or key.startswith(k + ".")), None)
    use = "model=hf model.name_or_path=<a hub id or a local folder>" if preset != "hf" else "model=tiny"
    return (
        f"{culprit}: model={preset} has no '{key}'{f' ({why})' if why else ''}; it is a setting of "
        f"{use.split()[0]}: use {use}, or drop {culprit.split('=', 1)[0]}"
    )


def _schema():
    from omegaconf import OmegaConf

    from rlcompare.config import RunConfig

    return OmegaConf.structured(RunConfig)


def _in_schema(key: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(_schema(), key, default="__absent__") != "__absent__"


def _accepted_keys(key: str) -> str:
    """'; accepted keys here: ...' for a key under a schema node (what a misspelt knob could have meant)."""
    from omegaconf import DictConfig, OmegaConf

    parent = key.rsplit(".", 1)[0] if "." in key else ""
    node = OmegaConf.select(_schema(), parent) if parent else _schema()
    return f"; accepted keys here: {', '.join(sorted(node.keys()))}" if isinstance(node, DictConfig) else ""


def _one_line(text: str) -> str:
    """Hydra's multi-line message as one line, without its search-path listing, OmegaConf's node details and the
    HYDRA_FULL_ERROR hint; an indented list under a header ("Available options in 'algorithm':") joined by commas."""
    out: list[str] = []
    listing = False
    for raw in text.split("\nConfig search path:")[0].splitlines():
        line = raw.strip().rstrip(".")
        if not line or "HYDRA_FULL_ERROR" in line or line.startswith(("full_key:", "object_type=", "reference_type=")):
            continue
        if listing and raw.startswith("\t"):
            out[-1] += (" " if out[-1].endswith(":") else ", ") + line
            continue
        out.append(line)
        listing = line.endswith(":")
    return "; ".join(out)
