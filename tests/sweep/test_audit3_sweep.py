"""Issue #41's sweep defects: two sweeps of one name in one folder, a run settled with another config, seeds after the
first unchecked, placement keys in a sweep file, a non-UTF-8 file and a label ending in a newline, and Ctrl-C (runs
completed before it recorded, the launcher's workers stopped, no queued job started after it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import FAST
from rlcompare.sweep import launch as sw_launch
from rlcompare.sweep import Job, SweepError, load_sweep, main, resolve_members, run_jobs, run_sweep

REPO = Path(__file__).resolve().parents[2]

SWEEP = """
    name: a3
    seeds: [0]
    base: {label: grpo, overrides: [algorithm=grpo]}
    variants:
      - {label: clip_higher, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
"""


def write(tmp_path: Path, text: str = SWEEP, name: str = "a3.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def finish(root: Path, j, status: str = "completed", **config_changes) -> None:
    """What a run of job j leaves: Hydra's .hydra/, its config.yaml (the member's, at j's seed, with changes) and a
    final summary."""
    d = root / f"{j.member.name}__s{j.seed}"
    (d / ".hydra").mkdir(parents=True, exist_ok=True)
    (d / ".hydra" / "overrides.yaml").write_text("[]\n")
    cfg = json.loads(json.dumps({**j.member.config, "seed": j.seed}))
    for key, value in config_changes.items():
        section, leaf = key.split("__")
        cfg[section][leaf] = value
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "summary.json").write_text(json.dumps({"status": status, "error": None}))


# ----------------------------------------------------------------------------- item 2: one sweep per folder
@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_second_sweep_of_the_same_name_is_refused_while_the_first_holds_the_folder(tmp_path, monkeypatch, capsys):
    p = write(tmp_path)
    root = tmp_path / "results" / "a3"
    holder = subprocess.Popen(  # the first sweep, as far as the folder can tell: a live process holding its lock
        [
            sys.executable,
            "-c",
            "import sys, time; from rlcompare.train import run_lock; run_lock.acquire(sys.argv[1]); "
            "print('held', flush=True); time.sleep(300)",
            str(root),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        launches = []
        monkeypatch.setattr(sw_launch, "launch_jobs", lambda *a: launches.append(a) or 0)
        capsys.readouterr()
        rc = main([str(p), f"results_dir={tmp_path / 'results'}"])
        err = capsys.readouterr().err
        assert rc == 2 and launches == []
        assert len(err.strip().splitlines()) == 1, err
        assert f"{root} is in use by another sweep (pid {holder.pid})" in err and "another name" in err
        assert not (root / "sweep.yaml").exists()  # the first sweep's record is left alone
    finally:
        holder.kill()
        holder.wait()
    # once the first sweep has ended, the folder is free again
    monkeypatch.setattr(sw_launch, "launch_jobs", lambda spec, root_, jobs, hx: [finish(root_, j) for j in jobs] and 0)
    assert run_sweep(p, [f"results_dir={tmp_path / 'results'}"]) == 0


def test_a_run_made_with_another_config_is_not_settled_as_the_members(tmp_path):
    """Another sweep (or a hand-typed `rlcompare train`) wrote the member's folder during the launch, with another
    lr: its fresh summary once made it this member's run. A run at another seed is not the member's either."""
    spec = load_sweep(write(tmp_path))
    grpo, clip = resolve_members(spec, [f"results_dir={tmp_path / 'results'}"])
    root = tmp_path / "results" / "a3"

    def launch(batch):
        finish(root, batch[0], trainer__lr=3e-4)
        finish(root, batch[1], status="failed")
        d = root / "clip_higher__s0"
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        (d / "config.yaml").write_text(yaml.safe_dump({**cfg, "seed": 7}))
        return 0

    res = run_jobs([Job(grpo, 0), Job(clip, 0)], root, launch)
    assert res[("grpo", 0)]["status"] == "failed"
    assert "another config than this member's (trainer.lr: 0.0003 -> 3e-05)" in res[("grpo", 0)]["error"]
    assert res[("clip_higher", 0)]["status"] == "failed" and "seed: 7 -> 0" in res[("clip_higher", 0)]["error"]


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_members_own_run_is_settled(tmp_path):
    spec = load_sweep(write(tmp_path))
    members = resolve_members(spec, [f"results_dir={tmp_path / 'results'}"])
    root = tmp_path / "results" / "a3"
    res = run_jobs([Job(m, 0) for m in members], root, lambda batch: [finish(root, j) for j in batch] and 0)
    assert {k: r["status"] for k, r in res.items()} == {("grpo", 0): "completed", ("clip_higher", 0): "completed"}


# ----------------------------------------------------------------------------- item 5: every seed checked
@pytest.mark.parametrize("how", ["file", "command line"])
def test_every_seed_is_checked_not_only_the_first(tmp_path, capsys, how):
    text = SWEEP.replace("seeds: [0]", "seeds: [0, -1]") if how == "file" else SWEEP
    args = [str(write(tmp_path, text)), f"results_dir={tmp_path / 'results'}", "--dry-run"]
    if how == "command line":
        args += ["--seeds", "0,-1"]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "seed -1 is refused (seed=-1 must be in [0, 2147483647])" in err, err
    assert not (tmp_path / "results").exists()


def test_a_sweep_seed_past_the_bound_is_refused_like_a_runs(tmp_path, capsys):
    # item 4 through item 5: torch keeps 32 bits of a seed, so 2**32 would repeat seed 0; the sweep applies the bound
    text = SWEEP.replace("seeds: [0]", "seeds: [0, 4294967296]")
    capsys.readouterr()
    assert main([str(write(tmp_path, text)), f"results_dir={tmp_path / 'results'}", "--dry-run"]) == 2
    assert "seed 4294967296 is refused (seed=4294967296 must be in [0, 2147483647])" in capsys.readouterr().err


# ----------------------------------------------------------------------------- item 9: sweep-wide keys
@pytest.mark.parametrize("override", ["results_dir=/tmp/elsewhere", "+results_dir=/x", "logger.project=other"])
@pytest.mark.parametrize("where", ["base", "variant"])
def test_a_member_may_not_set_a_sweep_wide_key(tmp_path, override, where):
    if where == "base":
        text = SWEEP.replace("overrides: [algorithm=grpo]", f'overrides: [algorithm=grpo, "{override}"]')
    else:
        text = SWEEP.replace("[algorithm.clip.eps_high=0.28]", f'[algorithm.clip.eps_high=0.28, "{override}"]')
    with pytest.raises(SweepError, match=r"applies to the whole sweep.*on the command line of `rlcompare sweep`"):
        load_sweep(write(tmp_path, text))


def test_the_command_line_sets_the_sweep_wide_keys(tmp_path):
    members = resolve_members(load_sweep(write(tmp_path)), [f"results_dir={tmp_path / 'r'}", "logger.project=p"])
    assert {m.config["results_dir"] for m in members} == {str(tmp_path / "r")}


# ----------------------------------------------------------------------------- item 13: the file itself
def test_a_non_utf8_sweep_file_is_refused_in_one_line(tmp_path, capsys):
    p = tmp_path / "latin1.yaml"
    p.write_bytes((textwrap.dedent(SWEEP) + "question: caf\xe9 or tea?\n").encode("latin-1"))
    capsys.readouterr()
    assert main([str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not UTF-8 text" in err and str(p) in err, err


@pytest.mark.parametrize("field", ["label", "name"])
def test_a_label_or_name_ending_in_a_newline_is_refused(tmp_path, field):
    if field == "label":
        text = SWEEP.replace("{label: clip_higher,", '{label: "clip_higher\\n",')
    else:
        text = SWEEP.replace("name: a3", 'name: "a3\\n"')
    with pytest.raises(SweepError, match=f"{field} 'a3\\\\n'|{field} 'clip_higher\\\\n'"):
        load_sweep(write(tmp_path, text))


# ----------------------------------------------------------------------------- item 20: Ctrl-C
@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_runs_completed_before_a_ctrl_c_are_recorded(tmp_path, monkeypatch, capsys):
    """The launch is interrupted after grpo completed: it is printed and written to sweep.yaml (it once said
    "finished runs: none" and `runs: {}`), and --resume keeps it."""
    p = write(tmp_path)
    root = tmp_path / "results" / "a3"

    def interrupted(spec, root_, jobs, hx):
        finish(root_, jobs[0])
        d = root_ / "clip_higher__s0"
        (d / ".hydra").mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"status": "failed", "error": "KeyboardInterrupt: "}))
        raise KeyboardInterrupt

    monkeypatch.setattr(sw_launch, "launch_jobs", interrupted)
    capsys.readouterr()
    assert run_sweep(p, [f"results_dir={tmp_path / 'results'}"]) == 130
    assert "interrupted; finished runs: grpo__s0. Continue with --resume" in capsys.readouterr().err
    runs = yaml.safe_load((root / "sweep.yaml").read_text())["runs"]
    assert runs == {"grpo": {"0": {"status": "completed", "error": None, "dir": str(root / "grpo__s0")}}}
    launches = []
    monkeypatch.setattr(
        sw_launch,
        "launch_jobs",
        lambda spec, r, jobs, hx: launches.append([j.key for j in jobs]) or finish(r, jobs[0]) or 0,
    )
    assert run_sweep(p, [f"results_dir={tmp_path / 'results'}"], resume=True) == 0
    assert launches == [[("clip_higher", 0)]]


def test_a_job_taken_up_after_the_interruption_is_not_started(tmp_path):
    ran = []
    task = sw_launch.UnlessInterrupted(ran.append, str(tmp_path / sw_launch.STOP_FILE))
    task("first")
    (tmp_path / sw_launch.STOP_FILE).touch()
    assert task("queued") is None
    assert ran == ["first"]


# a launcher whose process stops on SIGINT but leaves a worker behind that does not (joblib's loky workers could
# outlive their parent, once SIGKILLed by subprocess.call)
LEAVES_A_WORKER = """
import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('w', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE)
worker.stdout.readline()
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="reads the worker's state from /proc")
def test_ctrl_c_stops_every_process_of_the_launch(tmp_path, monkeypatch):
    monkeypatch.setattr(sw_launch, "STOP_GRACE_S", 3.0)
    script, pid_file = tmp_path / "launcher.py", tmp_path / "worker.pid"
    script.write_text(LEAVES_A_WORKER)
    stop = tmp_path / sw_launch.STOP_FILE
    real_wait = subprocess.Popen.wait
    calls = []

    def interrupted_wait(self, timeout=None):  # Ctrl-C once the worker runs
        if not calls:
            calls.append(1)
            while not pid_file.exists() or not pid_file.read_text():
                time.sleep(0.05)
            raise KeyboardInterrupt
        return real_wait(self, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        sw_launch._launch([sys.executable, str(script), str(pid_file)], stop)
    monkeypatch.undo()
    worker = int(pid_file.read_text())
    assert stop.exists()
    assert not _alive(worker), "the launcher's worker outlived the interrupted sweep"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


# ----------------------------------------------------------------------------- item 20: Ctrl-C, for real
QUICK = FAST  # the tests' seconds-long runs (conftest)
# four members: the base completes quickly; the others are long, so that the Ctrl-C finds them running or queued
LONG_SWEEP = """
    name: cc
    seeds: [0]
    base: {label: grpo, overrides: [algorithm=grpo, budget.max_steps=2]}
    variants:
      - {label: v1, component: budget, overrides: [budget.max_steps=400]}
      - {label: v2, component: budget, overrides: [budget.max_steps=401]}
      - {label: v3, component: budget, overrides: [budget.max_steps=402]}
"""


def _tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment holds tag (the sweep's and everything it started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if tag.encode() in (entry / "environ").read_bytes() and _alive(int(entry.name)):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


@pytest.mark.slow  # a real sweep: process starts, a warm start and two runs (a minute on a busy 2-core machine)
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="finds the sweep's processes through /proc")
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_sigint_to_a_sweep_records_its_completed_run_and_leaves_nothing_running(tmp_path, launcher):
    if launcher == "joblib":
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    tag = f"RLCOMPARE_TEST_TAG={uuid.uuid4().hex}"
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", tag.split("=")[0]: tag.split("=")[1]}
    hydra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    root = tmp_path / "results" / "cc"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcompare.cli", "sweep", str(write(tmp_path, LONG_SWEEP)), *QUICK, *hydra]
        + [f"results_dir={tmp_path / 'results'}"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell without job control starts background jobs with SIGINT ignored, and Python keeps an inherited
        # SIG_IGN (no KeyboardInterrupt): the sweep must get the default, as under a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 600
        while json.loads(_read(root / "grpo__s0" / "summary.json") or "{}").get("status") != "completed":
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        t_sigint = time.time()
        proc.send_signal(signal.SIGINT)  # to the sweep alone, as `kill -INT`; a terminal's Ctrl-C reaches it too
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    # grpo completed before the signal; a run may complete in the moment the signal takes to act: whatever did is
    # printed and recorded, and nothing else is
    completed = sorted(
        d.name for d in root.glob("*__s0") if json.loads(_read(d / "summary.json") or "{}").get("status") == "completed"
    )
    assert "grpo__s0" in completed
    assert f"interrupted; finished runs: {', '.join(completed)}." in err, err[-3000:]
    runs = yaml.safe_load((root / "sweep.yaml").read_text())["runs"]
    assert {f"{label}__s0" for label in runs} == set(completed)
    assert all(runs[label]["0"]["status"] == "completed" for label in runs)
    time.sleep(3)  # anything still running would start a queued run or write rows now
    assert _tagged_processes(tag) == []
    # Hydra writes a job's .hydra/ when it starts it; half a second covers the sweep's own reaction to the signal
    late = [d.name for d in root.glob("*/.hydra") if d.stat().st_mtime > t_sigint + 0.5]
    assert late == [], f"a queued job started after the interruption: {late}"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# ----------------------------------------------------------------------------- item 20: submitit's time limit
@pytest.mark.slow  # a real job under submitit's local executor, stopped by its time limit (a minute)
def test_submitits_time_limit_signal_checkpoints_and_stops_the_run_cleanly(tmp_path):
    """submitit sends its pre-timeout signal (USR2) signal_delay_s before the limit: the run treats it as a SIGTERM
    (the step in flight finishes, a checkpoint is saved, the error says how to continue). submitit's own handler
    ended the run with `SystemExit: 144` from inside a step, and no checkpoint."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    run = tmp_path / "results" / "default" / "limited"
    res = subprocess.run(
        # the shipped warm start (nothing to compute): the run is in its loop well before the signal
        [sys.executable, "-m", "rlcompare.cli", "train", "-m", *QUICK, "model.warm_start.steps=300"]
        + ["budget.max_steps=100000"]
        + ["trainer.checkpoint_every=3", f"results_dir={tmp_path / 'results'}", "run_name=limited"]
        # the local executor signals 30 s before timeout_min (its signal_delay_s, which Hydra's plugin cannot set)
        + ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (run / "summary.json").exists(), (res.stdout + res.stderr)[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    logs = "".join(p.read_text() for p in (tmp_path / "results").rglob("*_log.err"))
    assert summary["status"] == "failed", summary
    assert summary["error"].startswith("terminated (SIGTERM); checkpoint saved at step"), (summary, logs[-3000:])
    assert "SIGUSR2 from submitit: the job's time limit is near" in logs
    step = int(summary["error"].split("at step ")[1].split(",")[0])
    saved = [int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*") if p.is_dir()]
    assert step in saved and summary["steps"] == step
    assert "SystemExit" not in summary["error"] and res.returncode != 0


def test_a_completed_summary_without_a_config_is_not_settled_but_a_failure_keeps_its_error(tmp_path):
    spec = load_sweep(write(tmp_path))
    grpo, clip = resolve_members(spec, [f"results_dir={tmp_path / 'results'}"])
    root = tmp_path / "results" / "a3"

    def launch(batch):
        for j, status in zip(batch, ("completed", "failed")):
            d = root / f"{j.member.name}__s{j.seed}"
            (d / ".hydra").mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"status": status, "error": "ValueError: x"}))
        return 1

    res = run_jobs([Job(grpo, 0), Job(clip, 0)], root, launch)
    assert res[("grpo", 0)]["status"] == "failed" and "no readable config.yaml" in res[("grpo", 0)]["error"]
    assert res[("clip_higher", 0)] == {
        "status": "failed",
        "error": "ValueError: x",
        "dir": str(root / "clip_higher__s0"),
    }
