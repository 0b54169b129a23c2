"""`rlcompare sweep`: one-change-at-a-time ablation sweeps over seeds.

A sweep file (YAML, see sweeps/ and docs/components.md) names a base and its variants. Every member's
config is composed with Hydra's compose API and validated; each variant is diffed against its reference
(the base in ``mode: independent``, the previous rung in ``mode: ladder``) and the whole sweep is refused
before anything trains when a variant changes a key outside the component it declares, or changes nothing.
Then every member x seed is one job of a single Hydra multirun (``rlcompare train -m
hydra/sweeper=rlcompare_jobs ...``, in a subprocess; the jobs are listed in ``<results_dir>/<sweep name>/.jobs.yaml``),
so that the chosen launcher (``hydra/launcher=joblib``, ``submitit_slurm``, ``ray``, ...) runs as many at once as it
has workers, and a failing run never stops the others (`run_jobs`). Runs land in
``<results_dir>/<sweep name>/<label>__s<seed>/`` with ``sweep.{name,variant,reference,component}`` set
for the report. docs/scaling.md has the launchers and the device rule.

    rlcompare sweep sweeps/one_knob.yaml [overrides...] [--dry-run] [--seeds 0,1] [--resume]

Exit codes: 0 all runs completed (or a clean dry run), 1 some runs failed, 2 the sweep was refused, 130 interrupted
(Ctrl-C: the runs completed before it are recorded). The results folder is locked for the sweep's life.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from rlcompare.sweep import launch  # launch.launch_jobs at call time: tests replace it there
from rlcompare.sweep.jobs import _results_root, _runs_to_keep, run_jobs
from rlcompare.sweep.launch import Job, check_launch_settings
from rlcompare.sweep.resolve import Member, prepare, split_extra
from rlcompare.sweep.spec import SweepError, SweepSpec
from rlcompare.sweep.summary import _now, _print_dry_run, _print_outcome, _print_plan, _runs_record, write_record


def run_sweep(
    path,
    extra: Optional[list[str]] = None,
    seeds: Optional[list[int]] = None,
    dry_run: bool = False,
    resume: bool = False,
    argv: Optional[list[str]] = None,
    out=None,
) -> int:
    """Resolve, check and (unless dry_run) run a sweep; returns the exit code. Raises SweepError when refused."""
    out = out or sys.stdout
    extra = list(extra or [])
    spec, members = prepare(path, extra, seeds)
    _, hydra_extra = split_extra(extra)
    root = _results_root(members, spec)
    n_runs = len(members) * len(spec.seeds)
    _print_plan(spec, members, extra, root, n_runs, out)
    launcher = check_launch_settings(hydra_extra)
    if dry_run:
        _print_dry_run(spec, members, hydra_extra, launcher, n_runs, out)
        return 0
    with _sweep_lock(root):
        return _run_locked(spec, members, extra, hydra_extra, root, n_runs, resume, argv, out)


def _sweep_lock(root: Path):
    """The sweep's results folder, locked for the sweep's life (rlcompare.train.run_lock's lock, dropped by the
    kernel however the sweep ends): a second sweep of the same name and results_dir would take the first one's
    runs as its own and mix their configs in one comparison."""
    from rlcompare.config import ConfigError
    from rlcompare.train import run_lock

    try:
        return run_lock.acquire(root)
    except run_lock.RunFolderBusy:
        pid = run_lock.holder(root)
        raise SweepError(
            f"{root} is in use by another sweep ({f'pid {pid}' if pid else 'a live process'}); wait for it to end, "
            f"or give this one another name (`name:` in the sweep file) or results_dir"
        ) from None
    except ConfigError as e:
        raise SweepError(str(e)) from None


def _run_locked(
    spec: SweepSpec,
    members: list[Member],
    extra: list[str],
    hydra_extra: list[str],
    root: Path,
    n_runs: int,
    resume: bool,
    argv: Optional[list[str]],
    out,
) -> int:
    """run_sweep's part under the lock on root: the runs kept, the launches, the record."""
    existing = _runs_to_keep(root, spec, members, resume)
    record_argv = list(argv if argv is not None else [str(spec.path)] + extra)
    created = _now()
    write_record(root, spec, members, extra, record_argv, created=created)
    print("", file=out)
    jobs = [
        Job(m, s, resume=(m.name, s) in existing)
        for m in members
        for s in spec.seeds
        if existing.get((m.name, s)) != "completed"
    ]
    settled: dict[tuple[str, int], dict] = {}
    try:
        run_jobs(jobs, root, lambda batch: launch.launch_jobs(spec, root, batch, hydra_extra), results=settled)
    except KeyboardInterrupt:
        runs = _runs_record(root, members, spec.seeds, settled, existing, interrupted=True)
        print(
            "\nrlcompare sweep: interrupted; finished runs: "
            + (", ".join(f"{lb}__s{s}" for lb, s in settled) or "none")
            + ". Continue with --resume.",
            file=sys.stderr,
        )
        write_record(root, spec, members, extra, record_argv, runs=runs, created=created)
        return 130
    runs = _runs_record(root, members, spec.seeds, settled, existing)
    write_record(root, spec, members, extra, record_argv, runs=runs, created=created)
    return _print_outcome(spec, root, runs, n_runs, out)


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlcompare sweep",
        description="Run a one-change-at-a-time ablation sweep (a base and its variants, over seeds). Every member's "
        "config is resolved and checked before anything trains: a variant that changes a key outside its "
        "declared component, or nothing at all, refuses the sweep (exit code 2). See docs/components.md.",
        epilog="overrides (key=value, Hydra syntax) apply to every member, e.g. budget=medium logger=none "
        "results_dir=/tmp/results; hydra.* / hydra/launcher=... settings go to the launcher.",
    )
    p.add_argument("sweep_file", help="a sweep YAML file (or the name of one in sweeps/)")
    p.add_argument("overrides", nargs="*", help="config overrides applied to every member")
    p.add_argument("--dry-run", action="store_true", help="resolve and check only; print the member table")
    p.add_argument("--seeds", default=None, metavar="0,1,2", help="seeds to run instead of the file's")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a sweep whose results folder already holds runs: completed runs are kept, "
        "failed or interrupted ones resumed",
    )
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_intermixed_args(argv)
    seeds = None
    if args.seeds is not None:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip() != ""]
        except ValueError:
            print(
                f"rlcompare sweep: --seeds takes integers separated by commas, e.g. 0,1,2; got {args.seeds!r}",
                file=sys.stderr,
            )
            return 2
        if not seeds or len(set(seeds)) != len(seeds):
            print("rlcompare sweep: --seeds needs distinct integers, e.g. 0,1,2", file=sys.stderr)
            return 2
    try:
        return run_sweep(
            args.sweep_file, args.overrides, seeds=seeds, dry_run=args.dry_run, resume=args.resume, argv=argv
        )
    except SweepError as e:
        print(f"rlcompare sweep: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
