"""A sweep's jobs until each is settled (`run_jobs`), read from what each launch left in the run folders, and
the runs a `--resume` keeps (`_runs_to_keep`: refused without --resume, checked against the members' configs and
external inputs with it)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import yaml
from rlcompare.config.flat import flatten
from rlcompare.config.legacy import with_missing_defaults
from rlcompare.config.schema import flat_defaults
from rlcompare.sweep.launch import Job
from rlcompare.sweep.resolve import Member
from rlcompare.sweep.spec import _MISSING, SweepError, SweepSpec, _fmt, _ignored


def _results_root(members: list[Member], spec: SweepSpec) -> Path:
    return Path(str(members[0].config["results_dir"])) / spec.name


def run_dir(root: Path, label: str, seed: int) -> Path:
    return root / f"{label}__s{seed}"


def _summary(path: Path) -> Optional[dict]:
    try:
        return json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _has_metrics(path: Path) -> bool:
    f = path / "metrics.jsonl"
    try:
        return f.is_file() and f.stat().st_size > 0
    except OSError:
        return False


def _fresh_summary(d: Path, since: float) -> Optional[dict]:
    """summary.json written by this launch (an older one, e.g. of a run being resumed, does not count)."""
    try:
        if (d / "summary.json").stat().st_mtime < since - 1.0:
            return None
    except OSError:
        return None
    return _summary(d)


def _started(d: Path, since: float) -> bool:
    """Did this launch start the job? Hydra writes the job's .hydra/ before it calls rlcompare, which writes
    summary.json ("running") before anything heavy."""
    for f in (d / ".hydra" / "overrides.yaml", d / "summary.json"):
        try:
            if f.stat().st_mtime >= since - 1.0:
                return True
        except OSError:
            pass
    return False


def run_jobs(jobs: list[Job], root: Path, launch, results: Optional[dict] = None) -> dict[tuple[str, int], dict]:
    """Run jobs through `launch(jobs) -> exit code` until each is settled; returns {(label, seed): {status, error,
    dir}} (filled into `results` as jobs settle, so an interrupted sweep still records them).

    A job that raises is recorded as failed by its own summary and never stops the others (every launcher finishes
    the other jobs). A job whose process dies (an exit, a crash, a kill) can stop the launch: Hydra's basic launcher
    skips the jobs after it, joblib's stops every worker. After each launch: jobs with a summary of their own are
    settled; a job that started but left no final summary died: when it is the only one, it is the cause and
    failed; when several died at once (a parallel launcher stopped them together), each is relaunched alone, with
    resume=true, to tell the cause from the bystanders; jobs that never started are relaunched together. A launch
    that started no job at all failed as a whole (a bad launcher setting): its jobs are failed with its exit code.
    Every launch settles at least one job or moves one to a launch of its own, so this ends.
    """
    results = {} if results is None else results
    todo, alone = list(jobs), []
    while todo or alone:
        batch = [alone.pop(0)] if alone else todo
        t0 = time.time()
        try:
            rc = launch(batch)
        except KeyboardInterrupt:  # the runs that completed before the Ctrl-C are recorded (run_sweep re-raises)
            done: dict = {}
            _settle(batch, root, t0, done)
            results.update((k, r) for k, r in done.items() if r["status"] == "completed")
            raise
        died, waiting, progressed = _settle(batch, root, t0, results)
        if len(died) == 1:
            results[died[0].key] = _died(root, died[0], rc)
        elif died:
            alone += [Job(j.member, j.seed, resume=True) for j in died]
        if waiting and (rc == 0 or not (progressed or died)):
            why = (
                "the multirun ended (exit code 0) without this run's summary.json"
                if rc == 0
                else f"the launch failed before this job started (exit code {rc}); see the launcher's messages above"
            )
            for j in waiting:
                results[j.key] = {"status": "failed", "error": why, "dir": str(run_dir(root, *j.key))}
            waiting = []
        if rc != 0 and not (died or waiting) and all(results[j.key]["status"] == "completed" for j in batch):
            print(
                f"[rlcompare sweep] warning: `rlcompare train` exited with code {rc} although every run it launched "
                f"completed; their results are kept",
                file=sys.stderr,
            )
        if batch is todo:
            todo = waiting
        else:
            todo += waiting
    return results


def _settle(batch: list[Job], root: Path, t0: float, results: dict) -> tuple[list[Job], list[Job], bool]:
    """After one launch (started at t0): jobs with a summary of their own go into results; returns (jobs that
    started but left no final summary, jobs that never started, whether any job settled)."""
    died, waiting, progressed = [], [], False
    for j in batch:
        d = run_dir(root, *j.key)
        status = (_fresh_summary(d, t0) or {}).get("status")
        status = "failed" if status == "interrupted" else status  # a run stopped by its own Ctrl-C: not completed
        not_ours = _not_this_members_run(d, j, status) if status in ("completed", "failed") else None
        if not_ours:
            results[j.key] = {"status": "failed", "error": not_ours, "dir": str(d)}
            progressed = True
        elif status in ("completed", "failed"):
            results[j.key] = {
                "status": status,
                "error": (_summary(d) or {}).get("error") if status == "failed" else None,
                "dir": str(d),
            }
            progressed = True
        elif _started(d, t0):
            died.append(j)
        else:
            waiting.append(j)
    return died, waiting, progressed


def _not_this_members_run(d: Path, j: Job, status: str) -> Optional[str]:
    """Why the run in d is not this job's (another config or seed: another sweep or command wrote the folder), or
    None when its config.yaml is the member's at this seed (or it failed before writing one: its own error)."""
    cfg = _run_config(d)
    if cfg is None:
        if status == "failed":
            return None
        return f"{d} holds a summary but no readable config.yaml; the sweep cannot tell that it ran this member"
    seed = cfg.get("seed")
    changes = _config_changes(j.member.config_at(j.seed), cfg)
    if seed != j.seed or changes:
        what = changes or f"seed: {_fmt(seed)} -> {j.seed}"
        return (
            f"{d} holds a run made with another config than this member's ({what}): another command wrote the "
            f"folder; not counted as this member's run"
        )
    return None


def _died(root: Path, j: Job, rc: int) -> dict:
    d = run_dir(root, *j.key)
    summ = _summary(d) or {}
    if summ.get("status") == "running":
        err = summ.get("error") or f"the training process died mid-run (exit code {rc})"
    else:
        err = f"`rlcompare train` exited with code {rc} before this run wrote a summary"
    return {"status": "failed", "error": err, "dir": str(d)}


def _existing(root: Path, members: list[Member], seeds: list[int]) -> dict[tuple[str, int], str]:
    """(label, seed) -> completed | failed | partial, for run folders that already hold a run."""
    out = {}
    for m in members:
        for s in seeds:
            d = run_dir(root, m.name, s)
            summ = _summary(d)
            if summ is None and not _has_metrics(d):
                continue
            st = (summ or {}).get("status")
            out[(m.name, s)] = st if st in ("completed", "failed") else "partial"
    return out


def _run_config(d: Path) -> Optional[dict]:
    """The config.yaml a run wrote (safe-loaded), or None when missing or unreadable."""
    try:
        cfg = yaml.safe_load((d / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _config_changes(member_config: dict, run_config: dict) -> str:
    """How a run's config differs from its member's, outside the keys a sweep never counts ("" when it does not):
    `key: run's value -> member's value`, the first four."""
    # a key an older run's config.yaml lacks is compared as the default it held then
    now, then = with_missing_defaults(flatten(member_config), flatten(run_config), flat_defaults())
    keys = [
        k for k in sorted(set(now) | set(then)) if not _ignored(k) and now.get(k, _MISSING) != then.get(k, _MISSING)
    ]
    shown = ", ".join(f"{k}: {_fmt(then.get(k, _MISSING))} -> {_fmt(now.get(k, _MISSING))}" for k in keys[:4])
    return shown + (", ..." if len(keys) > 4 else "")


def _check_kept_runs(root: Path, members: list[Member], existing: dict) -> None:
    """--resume keeps earlier runs: refuse when one was made with another config than its member's now."""
    by_name = {m.name: m for m in members}
    bad = []
    for (label, seed), _status in sorted(existing.items()):
        old = _run_config(run_dir(root, label, seed))
        if old is None:
            continue
        changes = _config_changes(by_name[label].config_at(seed), old)
        if changes:
            bad.append(f"{label}__s{seed} ({changes})")
    if bad:
        raise SweepError(
            f"--resume: runs in {root} were made with another config than the sweep now gives them: "
            f"{'; '.join(bad)}. Keep the same file and overrides, or use another results_dir / sweep name"
        )


def _check_kept_inputs(root: Path, members: list[Member], existing: dict) -> None:
    """--resume keeps completed runs and continues the others from their checkpoints: the external inputs each
    recorded (rlcompare.train.inputs: a teacher's weights or checkpoint step, a plug-in module's source, a
    verifiers environment's package and version) must be what its member names now, or the sweep would compare
    (a kept run) or mix in one run's rows (a continued one) two setups under one config. Refused before anything
    trains, naming each run and input; a run that starts over (no checkpoint) keeps nothing and is not checked."""
    from rlcompare.train.checkpoint_dirs import candidates
    from rlcompare.train.inputs import differences, external_inputs, recorded_inputs

    by_name = {m.name: m for m in members}
    bad, unchecked = [], []
    for (label, seed), status in sorted(existing.items()):
        d = run_dir(root, label, seed)
        if status != "completed" and not candidates(d):
            continue
        now = external_inputs(by_name[label].config_at(seed))  # a teacher per seed: this seed's
        then = recorded_inputs(d)
        changed = differences(then, now) if then is not None else []
        if then is None and now:
            unchecked.append(f"{label}__s{seed}")
        elif changed:
            bad.append(f"{label}__s{seed} ({'; '.join(changed[:3])})")
    if unchecked:
        print(
            f"[rlcompare sweep] --resume: {', '.join(unchecked)} record no external inputs (fingerprint.json written "
            f"before they were recorded, or missing): their teacher or plug-in modules cannot be checked",
            file=sys.stderr,
        )
    if bad:
        raise SweepError(
            f"--resume: an input of runs in {root} changed since they ran: {'; '.join(bad)}. Their rows were "
            f"computed with the old one: put it back as it was (the teacher's files or checkpoints, the module's "
            f"source, the package's version) to continue this sweep, or run it anew under another results_dir / "
            f"sweep name (`name:` in the sweep file)"
        )


def _runs_to_keep(root: Path, spec: SweepSpec, members: list[Member], resume: bool) -> dict[tuple[str, int], str]:
    """Runs of this sweep already in root ((label, seed) -> status): refused without --resume, and with it checked
    to have been made with the config and the external inputs their member has now."""
    existing = _existing(root, members, spec.seeds)
    if existing and not resume:
        listing = ", ".join(f"{lb}__s{s} ({st})" for (lb, s), st in sorted(existing.items()))
        raise SweepError(
            f"{root} already holds runs of this sweep: {listing}. Continue it with "
            f"`rlcompare sweep {spec.path or spec.name} --resume ...` (completed runs are kept, the others "
            f"resumed), or choose another results_dir / sweep name"
        )
    if existing:
        _check_kept_runs(root, members, existing)
        _check_kept_inputs(root, members, existing)
    return existing
