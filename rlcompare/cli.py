"""`rlcompare {train,sweep,report,bench}`: thin faces over train(cfg), the sweep runner, the report and the benchmark."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

USAGE = """usage: rlcompare <command> [args]

commands:
  train [overrides]                 train one run (a Hydra app: -m for multirun, --cfg job, --help)
  sweep sweeps/<name>.yaml [overrides]  a one-change-at-a-time ablation sweep over seeds
  report <results dir> [options]    statistics, intervals and plots from results/
  bench [--sizes ...]               speed against TRL's GRPOTrainer on identical work
"""


def conf_dir() -> str:
    """conf/ next to the package (a source checkout), else the copy packaged inside it."""
    env = os.environ.get("RLCOMPARE_CONF")
    if env:
        return os.path.abspath(env)
    here = Path(__file__).resolve().parent
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


def run_name(algorithm: str, seed, overrides: str, explicit=None, results_dir=None, experiment=None, resume=None) -> str:
    """Run names say what ran (preset, key overrides, seed). A derived name that is taken by an earlier run
    gets a numeric suffix (`grpo__s0-2`), unless the run is being resumed; an explicit `run_name` is kept."""
    if explicit not in (None, "", "None", "null"):
        return str(explicit)
    key = (algorithm, str(seed), overrides or "", str(results_dir), str(experiment), str(resume))
    if key in _NAME_CACHE:  # Hydra resolves the run dir more than once: answer the same each time
        return _NAME_CACHE[key]
    parts = [algorithm] + ([_short_values(overrides)] if overrides else []) + [f"s{seed}"]
    name = re.sub(r"[^A-Za-z0-9._=,+\-]+", "_", "__".join(parts))
    if len(name) > MAX_NAME:  # cut, and keep names of different override sets apart with a hash of them all
        digest = hashlib.sha1("__".join([algorithm, overrides or "", str(seed)]).encode()).hexdigest()[:8]
        name = f"{name[:MAX_NAME - 9]}~{digest}"
    resuming = str(resume).lower() not in ("false", "none", "0", "")
    if results_dir is not None and not resuming:
        base, n = name, 1
        while _name_taken(Path(str(results_dir)) / str(experiment) / name):
            n += 1
            name = f"{base}-{n}"
    _NAME_CACHE[key] = name
    return name


def _name_taken(folder: Path) -> bool:
    """A run folder is taken once it holds a run, or while a live process writes it (it locks the folder
    before it writes its config.yaml)."""
    if (folder / "config.yaml").exists():
        return True
    from rlcompare.run_lock import holder

    return holder(folder) is not None


_RESUME_ARG = re.compile(r"(\+{0,2}resume=)(.*)", re.S)


def quote_resume_path(arg: str) -> str:
    """`resume=<run dir>` as typed, made one Hydra value: derived run names hold `=` (and may hold `,`), which
    Hydra's override grammar rejects or splits in an unquoted value, so the path is passed as a quoted string.
    true/false/null and values already quoted are left as they are."""
    m = _RESUME_ARG.fullmatch(arg)
    if m is None:
        return arg
    key, value = m.groups()
    if re.fullmatch(r"[A-Za-z0-9_]*", value) or value[:1] in ("'", '"'):
        return arg
    # Hydra's quoted strings: backslashes before a quote or the closing quote are doubled, quotes escaped;
    # OmegaConf's: `${` starts an interpolation unless escaped
    escaped = re.sub(r"(\\*)('|$)", lambda q: q.group(1) * 2 + ("\\'" if q.group(2) else ""), value.replace("${", "\\${"))
    return f"{key}'{escaped}'"


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("rlc_run_name"):
        OmegaConf.register_new_resolver("rlc_run_name", run_name)


def train_main(argv: list[str]) -> int:
    import hydra
    from omegaconf import DictConfig

    register_resolvers()

    @hydra.main(config_path=conf_dir(), config_name="config", version_base=None)
    def _app(cfg: DictConfig) -> None:
        from rlcompare.config import ConfigError
        from rlcompare.placement import place_job
        from rlcompare.run import train

        try:
            summary = train(place_job(cfg))  # a multirun job's threads and device (docs/scaling.md)
        except ConfigError as e:
            print(f"rlcompare: config error: {e}", file=sys.stderr)
            if _is_multirun():
                raise  # let Hydra's launcher go on with the other jobs and report this one at the end
            raise SystemExit(2)
        acc0, acc1 = summary.get("eval/accuracy_initial"), summary.get("eval/accuracy_final")
        print(f"[rlcompare] {summary['run_name']}: held-out accuracy {acc0:.3f} -> {acc1:.3f} "
              f"({summary['tokens/generated']} generated tokens, {summary['wall_time_s']:.0f} s); results in {summary['run_dir']}",
              file=sys.stderr)

    argv = [quote_resume_path(a) for a in argv]  # resume=<dir> whose name holds '=' (Hydra's grammar needs quotes)
    from rlcompare.precheck import check_train_args

    error = check_train_args(argv)  # before Hydra makes the run folder and the job imports torch
    if error is not None:
        print(f"rlcompare: config error: {error}", file=sys.stderr)
        return 2
    from rlcompare.placement import note_multirun_jobs

    note_multirun_jobs(argv)  # how many jobs `-m` makes, so that concurrent ones split the machine
    sys.argv = ["rlcompare train"] + argv
    _app()
    return 0


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return train_main(rest)
    if cmd == "sweep":
        from rlcompare.sweep import main as sweep_main

        return sweep_main(rest)
    if cmd == "report":
        from rlcompare.report import main as report_main

        return report_main(rest)
    if cmd == "bench":
        from rlcompare.bench import main as bench_main

        return bench_main(rest)
    print(f"rlcompare: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
