"""The Hydra multirun that runs a sweep's jobs: each job's overrides (`Job`), the job list and the command
(`launch_command`, read back by hydra_plugins/rlcompare_sweeper through `read_jobs_file` and `job_batch`), the
launch's process group and its stop on Ctrl-C (`launch_jobs`), and the launcher's settings checked before anything
runs (`check_launch_settings`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from rlcompare.config.components import component_prefixes
from rlcompare.sweep.resolve import Member
from rlcompare.sweep.spec import SweepError, SweepSpec, _merge_overrides, _override_parser


def _member_tags(spec: SweepSpec, m: Member, seed: str) -> list[str]:
    """The keys the sweep sets on each run of a member (seed: one seed, or a comma list for a multirun)."""
    comp = ",".join(component_prefixes(m.component)) if m.component else "null"
    if "," in comp:
        comp = _quote(comp)  # a quoted string, not a Hydra sweep over values
    return [
        f"seed={seed}",
        f"experiment={spec.name}",
        f"sweep.name={spec.name}",
        f"sweep.variant={m.name}",
        f"sweep.reference={m.reference or 'null'}",
        f"sweep.component={comp}",
        "run_name=" + m.name + "__s${seed}",
    ]


def train_command(
    spec: SweepSpec, m: Member, seeds: list[int], hydra_extra: list[str], resume: bool = False
) -> list[str]:
    """`python -m rlcompare.cli train -m ...` for one member over seeds (the sweep's tags last but hydra.*): what
    the sweep's jobs of that member are, as one multirun one can type."""
    tags = _member_tags(spec, m, ",".join(str(s) for s in seeds))
    if resume:
        tags.append("resume=true")
    return [sys.executable, "-m", "rlcompare.cli", "train", "-m", *m.overrides, *tags, *hydra_extra]


@dataclass
class Job:
    """One run of a sweep: a member at a seed (resume: its folder already holds a run to continue)."""

    member: Member
    seed: int
    resume: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.member.name, self.seed)

    def overrides(self, spec: SweepSpec) -> list[str]:
        return [*self.member.overrides, *_member_tags(spec, self.member, str(self.seed))] + (
            ["resume=true"] if self.resume else []
        )


JOBS_FILE = ".jobs.yaml"  # in <results_dir>/<sweep name>/: the job list of the latest launch


def launch_command(spec: SweepSpec, root: Path, jobs_file: Path, hydra_extra: list[str]) -> list[str]:
    """One Hydra multirun whose jobs are those listed in jobs_file (hydra_plugins.rlcompare_sweeper); results_dir
    and experiment on the command line place Hydra's own sweep files (multirun.yaml) in <results_dir>/<name>/."""
    return [
        sys.executable,
        "-m",
        "rlcompare.cli",
        "train",
        "-m",
        "hydra/sweeper=rlcompare_jobs",
        f"hydra.sweeper.jobs_file={_quote(str(jobs_file.resolve()))}",
        f"results_dir={_quote(str(root.parent))}",
        f"experiment={spec.name}",
        *hydra_extra,
    ]


def read_jobs_file(path: Optional[str]) -> list[list[str]]:
    """The job list of hydra/sweeper=rlcompare_jobs: `jobs: [[override, ...], ...]` (plain YAML, safe-loaded)."""
    from hydra.errors import HydraException

    if not path:
        raise HydraException(
            "hydra.sweeper.jobs_file is not set: hydra/sweeper=rlcompare_jobs launches the jobs "
            "listed in that file (`jobs: [[key=value, ...], ...]`, as `rlcompare sweep` writes it)"
        )
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise HydraException(f"hydra.sweeper.jobs_file={path}: cannot be read ({e})") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if (
        not isinstance(jobs, list)
        or not jobs
        or not all(isinstance(j, list) and all(isinstance(o, str) for o in j) for j in jobs)
    ):
        raise HydraException(
            f"hydra.sweeper.jobs_file={path}: expected `jobs:` holding a non-empty list of override "
            f"lists, e.g. jobs: [[algorithm=grpo, seed=0], [algorithm=dapo, seed=0]]"
        )
    return jobs


def job_batch(arguments: list[str], jobs: list[list[str]]) -> list[list[str]]:
    """Each job's overrides after the command line's (a job's own value of a key wins); the command line may not
    sweep over values here (the job list is the sweep)."""
    from hydra.errors import HydraException

    for raw, o in zip(arguments, _override_parser().parse_overrides(list(arguments))):
        if o.is_sweep_override():
            raise HydraException(
                f"`{raw}`: hydra/sweeper=rlcompare_jobs launches the jobs of hydra.sweeper.jobs_file; "
                f"list each value as its own job there instead of sweeping on the command line"
            )
    return [_merge_overrides(list(arguments), job) for job in jobs]


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _shell(cmd: list[str]) -> str:
    """The command as one would type it in a POSIX shell."""
    import shlex

    def q(a: str) -> str:
        if re.fullmatch(r"[A-Za-z0-9_./=,:+@%-]+", a):
            return a
        if "'" not in a:
            return "'" + a + "'"
        if not re.search(r'[$"`\\!]', a):
            return '"' + a + '"'
        return shlex.quote(a)

    shown = ["rlcompare"] + cmd[3:] if cmd[1:3] == ["-m", "rlcompare.cli"] else cmd
    return " ".join(q(c) for c in shown)


# ----------------------------------------------------------------------------- the launch's processes
STOP_FILE = ".interrupted"  # in <results_dir>/<sweep name>/: the sweep was interrupted; start no further job
STOP_GRACE_S = 60.0  # after Ctrl-C, how long the launch's runs have to record their state before SIGTERM


@dataclass
class UnlessInterrupted:
    """The task function of a sweep's multirun (hydra_plugins.rlcompare_sweeper wraps it): a job a launcher's worker
    takes up after the sweep was interrupted (STOP_FILE exists) is not started. A joblib worker whose run had
    stopped on the Ctrl-C once went on to the next queued job. A plain class here (not in the plugin module, which
    Hydra imports under another name) so that launchers can pickle it by reference."""

    task: Any
    stop_file: str

    def __call__(self, cfg):
        if os.path.exists(self.stop_file):
            print("[rlcompare sweep] the sweep was interrupted: this queued job is not started", file=sys.stderr)
            return None
        return self.task(cfg)


def _launch(cmd: list[str], stop_file: Optional[Path] = None) -> int:
    """Run the launch in a process group of its own and wait; on Ctrl-C stop the whole group (`_stop_launch`)."""
    try:
        proc = subprocess.Popen(cmd, start_new_session=True)
    except OSError as e:
        print(f"rlcompare sweep: could not start {cmd[0]}: {e}", file=sys.stderr)
        return 127
    try:
        return proc.wait()
    except KeyboardInterrupt:
        if stop_file is not None:
            stop_file.touch()  # before the signal: a worker freed by it must not start a queued job
        _stop_launch(proc)
        raise


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Does a live (not zombie) process remain in the process group? On Linux from /proc, since an orphaned worker
    may stay a zombie where nothing reaps it; elsewhere whether the group can be signalled."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _wait_group(proc: subprocess.Popen, pgid: int, seconds: float) -> bool:
    """Wait until no process of the group is left (the launcher's own one reaped); False on timeout."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


def _stop_launch(proc: subprocess.Popen) -> None:
    """Ctrl-C during a launch. The launch runs in its own process group, so that a Ctrl-C (or a SIGINT sent to the
    sweep alone) reaches every process of its launcher, workers included: subprocess.call used to SIGKILL the
    launcher's process alone, orphaning joblib's workers. The group gets SIGINT (runs record their state and stop);
    what is left after STOP_GRACE_S gets SIGTERM, then SIGKILL. A second Ctrl-C kills the group at once."""
    import signal

    pgid = proc.pid
    try:
        _signal_group(pgid, signal.SIGINT)
        if not _wait_group(proc, pgid, STOP_GRACE_S):
            _signal_group(pgid, signal.SIGTERM)
            _wait_group(proc, pgid, 10.0)
    except KeyboardInterrupt:
        pass
    finally:
        _signal_group(pgid, signal.SIGKILL)
        proc.wait()


def launch_jobs(spec: SweepSpec, root: Path, jobs: list[Job], hydra_extra: list[str]) -> int:
    """Every job in one Hydra multirun (its launcher runs as many at once as it has workers); the exit code."""
    jobs_file = root / JOBS_FILE
    (root / STOP_FILE).unlink(missing_ok=True)
    tmp = root / f".{JOBS_FILE}.tmp"
    tmp.write_text(yaml.safe_dump({"jobs": [j.overrides(spec) for j in jobs]}, sort_keys=False, width=1000))
    os.replace(tmp, jobs_file)
    cmd = launch_command(spec, root, jobs_file, hydra_extra)
    names = ", ".join(f"{j.member.name}__s{j.seed}" + (" (resume)" if j.resume else "") for j in jobs)
    print(f"[rlcompare sweep] launching {len(jobs)} job(s): {names}\n  {_shell(cmd)}", file=sys.stderr, flush=True)
    return _launch(cmd, root / STOP_FILE)


def check_launch_settings(hydra_extra: list[str]) -> str:
    """Compose the launch's Hydra settings (launcher and its options) before anything runs; returns the launcher's
    name. A launcher that is not installed or an unknown option refuses the sweep, naming the fix."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from rlcompare.train.app import conf_dir, register_resolvers

    for raw in hydra_extra:
        if raw.lstrip("+~").startswith(("hydra/sweeper", "hydra.sweeper")):
            raise SweepError(
                f"`{raw}`: a sweep launches its members x seeds through its own sweeper "
                f"(hydra/sweeper=rlcompare_jobs); choose the launcher instead, e.g. hydra/launcher=joblib"
            )
    register_resolvers()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base=None):
            cfg = compose(
                config_name="config", overrides=["hydra/sweeper=rlcompare_jobs", *hydra_extra], return_hydra_config=True
            )
    except HydraException as e:
        msg = str(e).strip()
        if "hydra/sweeper/rlcompare_jobs" in msg:
            raise SweepError(
                "Hydra cannot find rlcompare's sweeper (hydra_plugins/rlcompare_sweeper, shipped with "
                "rlcompare). From Python, call hydra_plugins.rlcompare_sweeper.register() first, as "
                "`rlcompare sweep` does; if it cannot be imported, reinstall with `pip install -e .` from the "
                "repository"
            ) from None
        raise SweepError(
            f"the Hydra settings {' '.join(hydra_extra)} do not compose: {msg}\n"
            f"(launchers: hydra/launcher=joblib is in the base install; "
            f'pip install -e ".[launchers]" adds submitit_local and submitit_slurm; docs/scaling.md)'
        ) from None
    target = str(cfg.hydra.launcher.get("_target_", ""))
    return target.rsplit(".", 1)[-1] or "basic launcher"
