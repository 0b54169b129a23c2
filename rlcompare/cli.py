"""`rlcompare {train,sweep,report,bench}`: thin faces over train(cfg), the sweep runner, the report and the benchmark."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile

# conf/ and the run-name resolver live in train/app.py (run, sweep, bench and precheck need them, and must not
# import the CLI: that was the cycle cli <-> run/sweep/bench); imported here, where they were.
from rlcompare.train.app import MAX_NAME, conf_dir, register_resolvers, run_name  # noqa: F401

USAGE = """usage: rlcompare <command> [args]

commands:
  train [overrides]                 train one run (a Hydra app: -m for multirun, --cfg job, --help)
  sweep sweeps/<name>.yaml [overrides]  a one-change-at-a-time ablation sweep over seeds
  report <results dir> [options]    statistics, intervals and plots from results/
  bench [--sizes ...]               speed against TRL's GRPOTrainer on identical work
  export <run dir> --out <dir> [--step N] [--adapter]  the trained policy as a Hugging Face folder

shell completion of train's overrides: eval "$(rlcompare -sc install=bash)" (zsh, fish too)
"""


COMMANDS = ("train", "sweep", "report", "bench", "export")
SHELL_COMPLETION = ("-sc", "--shell-completion")  # Hydra's flag: install=bash|zsh|fish, uninstall=..., query=...

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
    escaped = re.sub(
        r"(\\*)('|$)", lambda q: q.group(1) * 2 + ("\\'" if q.group(2) else ""), value.replace("${", "\\${")
    )
    return f"{key}'{escaped}'"


def _train_job(cfg) -> None:
    """One job of `rlcompare train` (a run, or one member of `-m`): its failures as one line each, no traceback."""
    from rlcompare.config import ConfigError
    from rlcompare.train.failure import PluginFailed
    from rlcompare.health import UnhealthyRun
    from rlcompare.train.placement import place_job
    from rlcompare.train.run import Terminated, closing_line, train

    try:
        summary = train(place_job(cfg))  # a multirun job's threads and device (docs/scaling.md)
    except (UnhealthyRun, PluginFailed) as e:  # recorded (summary.json failed): one line, exit 1, no traceback
        _failed_in_one_line(e)
    except Terminated as e:  # SIGTERM or Ctrl-C: one line saying how to continue; the exit status stays 143 / 130
        if e.run_dir is not None:
            print(e.closing_line(), flush=True)
        raise
    except KeyboardInterrupt:  # Ctrl-C before the run folder was written (checks, the folder's lock)
        print("[rlcompare] interrupted before the run started; nothing was written", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except ConfigError as e:
        print(f"rlcompare: config error: {e}", file=sys.stderr)
        if _is_multirun():
            raise  # let Hydra's launcher go on with the other jobs and report this one at the end
        raise SystemExit(2)
    if "rank" in summary:  # a data-parallel rank > 0: rank 0 prints the run's closing line
        return
    print(closing_line(summary), flush=True)  # stdout: the run's result, with a path to type next


def train_main(argv: list[str]) -> int:
    import hydra
    from omegaconf import DictConfig

    register_resolvers()

    @hydra.main(config_path=conf_dir(), config_name="config", version_base=None)
    def _app(cfg: DictConfig) -> None:
        _train_job(cfg)

    argv = [quote_resume_path(a) for a in argv]  # resume=<dir> whose name holds '=' (Hydra's grammar needs quotes)
    from rlcompare.config import user_modules

    try:  # before Hydra composes: a plug-in surrogate's knobs are config keys once it is registered
        user_modules.import_modules_in_overrides(argv)
    except ValueError as e:
        print(f"rlcompare: config error: {e}", file=sys.stderr)
        return 2
    if "WORLD_SIZE" in os.environ and any(a in ("-m", "--multirun") for a in argv):
        print(
            "rlcompare: config error: `train -m` under torchrun would run the whole multirun on every rank; run "
            "the multirun without torchrun, or one run per torchrun launch",
            file=sys.stderr,
        )
        return 2
    follower_dir = _follower_hydra_dir()
    if follower_dir is not None:  # torchrun's rank > 0: rank 0 checks the command and owns the run folder
        sys.argv = (
            ["rlcompare train"]
            + argv
            + [
                f"hydra.run.dir={follower_dir}",
                "hydra.output_subdir=null",
                "hydra/job_logging=disabled",
                "hydra/hydra_logging=disabled",
            ]
        )
        try:
            _app()
        finally:
            shutil.rmtree(follower_dir, ignore_errors=True)
        return 0
    from rlcompare.train.precheck import check_train_args

    error = check_train_args(argv)  # before Hydra makes the run folder and the job imports torch
    if error is not None:
        print(f"rlcompare: config error: {error}", file=sys.stderr)
        return 2
    from rlcompare.train.placement import note_multirun_jobs

    note_multirun_jobs(argv)  # how many jobs `-m` makes, so that concurrent ones split the machine
    # `rlcompare sweep` runs `train -m hydra/sweeper=rlcompare_jobs`. Registered after the checks above: Hydra's
    # plugin scan imports every installed launcher, which a config error need not wait for
    _register_sweeper()
    # Hydra's completion script registers, and calls back, the program sys.argv[0] names: `rlcompare`
    sys.argv = ["rlcompare" if any(a in SHELL_COMPLETION for a in argv) else "rlcompare train"] + argv
    _app()
    return 0


def _failed_in_one_line(e: Exception) -> None:
    """A run that recorded its failure (an unhealthy run, a plug-in's error): its one line, exit status 1."""
    print(f"[rlcompare] failed: {e}", file=sys.stderr, flush=True)
    if _is_multirun():
        raise e  # Hydra's launcher goes on with the other jobs and reports this one at the end
    raise SystemExit(1)


def completion_main(argv: list[str]) -> int:
    """`rlcompare [train] -sc install=bash` (zsh, fish; uninstall=...): Hydra's shell completion of `rlcompare
    train`'s overrides. The script Hydra prints calls back `rlcompare -sc query=bash` with the line typed in
    COMP_LINE: the command word is completed here, `train`'s overrides by Hydra (the line without `train`, as Hydra
    reads an app's), other commands' arguments by the shell's file completion."""
    line = os.environ.get("COMP_LINE")
    if line is not None and any(a.startswith("query=") for a in argv):
        typed = line.split()[1:]  # after `rlcompare`
        if len(typed) == 0 or (len(typed) == 1 and not line.endswith(" ")):
            print(" ".join(c for c in COMMANDS if c.startswith(typed[0] if typed else "")))
            return 0
        if typed[0] != "train":
            return 0
        os.environ["COMP_LINE"] = re.sub(r"\s+train\b", "", line, count=1)
    return train_main([a for a in argv if a != "train"])


def _register_sweeper() -> None:
    from hydra_plugins.rlcompare_sweeper import register

    register()


def _follower_hydra_dir() -> str | None:
    """Under torchrun, ranks > 0 write nothing: Hydra gets a scratch output folder (removed after) and no logs."""
    if int(os.environ.get("RANK", "0")) == 0 or "WORLD_SIZE" not in os.environ:
        return None
    return tempfile.mkdtemp(prefix=f"rlcompare-rank{os.environ['RANK']}-")


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
    if any(a in SHELL_COMPLETION for a in argv[:2]):  # `rlcompare -sc ...`, `rlcompare train -sc ...`
        return completion_main(argv)
    if cmd == "train":
        return train_main(rest)
    if cmd == "sweep":
        from rlcompare.sweep import main as sweep_main

        _register_sweeper()  # the sweep composes hydra/sweeper=rlcompare_jobs to check its launcher settings

        return sweep_main(rest)
    if cmd == "report":
        from rlcompare.report import main as report_main

        return report_main(rest)
    if cmd == "bench":
        from rlcompare.bench import main as bench_main

        return bench_main(rest)
    if cmd == "export":
        from rlcompare.train.export import main as export_main

        return export_main(rest)
    print(f"rlcompare: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
