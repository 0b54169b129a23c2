"""One writer per run folder (issue 18): a second writer is refused naming the live one's pid, before the model
loads; a lock left by a killed process is taken over; two racing writers never both write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST
from rlcompare.train import run_lock
from rlcompare.cli import run_name
from rlcompare.config import ConfigError
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl

REPO = Path(__file__).resolve().parents[2]
LONG = ["algorithm=grpo", "budget.max_steps=6", "trainer.eval_every=3"]


def _env(**extra) -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "offline", **extra}


def _cli(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "rlcompare.cli", "train", *FAST, *overrides]


def _wait(pred, proc: subprocess.Popen, what: str, timeout: float = 240.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return
        if proc.poll() is not None:
            pytest.fail(f"the process exited (code {proc.returncode}) before {what}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"no {what} within {timeout} s")


def _holder_process(folder: Path) -> subprocess.Popen:
    """A separate process that locks `folder` the way a run does, then waits to be killed."""
    code = (
        "import sys, time; from rlcompare.train import run_lock; run_lock.acquire(sys.argv[1]); "
        "print('locked', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.slow
def test_a_second_writer_on_a_live_run_fails_naming_its_pid_and_the_first_run_is_untouched(tmp_path):
    results = tmp_path / "results"
    run = results / "default" / "busy"
    args = (*LONG, "run_name=busy", f"results_dir={results}")
    first = subprocess.Popen(
        _cli(*args), cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=open(tmp_path / "first.log", "w")
    )
    _wait(lambda: len(read_jsonl(run / "metrics.jsonl")) >= 1, first, "its first row")
    first.send_signal(signal.SIGSTOP)  # alive and holding the folder, mid-run, for as long as the test needs
    try:
        for extra in ((), ("resume=true",), (f"resume={run}",)):
            out = subprocess.run(
                _cli(*args, *extra), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
            )
            assert out.returncode == 2, (extra, out.stderr[-2000:])
            assert f"is being written by another rlcompare process (pid {first.pid}" in out.stderr, extra
            assert "resuming" not in out.stderr and "Traceback" not in out.stderr, extra
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_two_writers_started_together_one_runs_the_other_is_refused(tmp_path):
    results = tmp_path / "results"
    run = results / "default" / "race"
    args = (*LONG, "run_name=race", f"results_dir={results}")
    procs = [
        subprocess.Popen(
            _cli(*args),
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"race{i}.log", "w"),
        )
        for i in range(2)
    ]
    codes = [p.wait(timeout=400) for p in procs]
    logs = [(tmp_path / f"race{i}.log").read_text() for i in range(2)]
    assert sorted(codes) == [0, 2], logs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    # refused either by the lock (naming the live writer) or, if it came after the run had its rows, as a folder
    # that already holds a run: never both writing
    assert (f"(pid {procs[winner].pid}" in logs[loser]) or "already holds a run" in logs[loser], logs[loser]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_the_lock_is_checked_before_the_model_loads(compose, tmp_path, monkeypatch):
    from rlcompare.train import trainer

    cfg = compose(*LONG, "run_name=held")
    folder = Path(cfg.results_dir) / "default" / "held"
    holder = _holder_process(folder)
    try:
        monkeypatch.setattr(trainer.Trainer, "__init__", lambda *a, **k: pytest.fail("the model was loaded"))
        with pytest.raises(run_lock.RunFolderBusy, match=rf"pid {holder.pid}\b"):
            train(cfg)
        assert not (folder / "config.yaml").exists() and not (folder / "summary.json").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, capsys):
    folder = tmp_path / "run"
    holder = _holder_process(folder)
    assert run_lock.holder(folder) == holder.pid  # the kernel's answer, while it lives
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert run_lock.holder(folder) is None
    with run_lock.acquire(folder):
        assert f"previous writer (pid {holder.pid})" in capsys.readouterr().err
        assert json.loads((folder / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    assert (folder / run_lock.LOCK_FILE).read_text() == ""  # a clean release leaves no pid to report
    with run_lock.acquire(folder):
        assert "previous writer" not in capsys.readouterr().err


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_run_releases_its_folder_when_it_ends_or_fails(compose):
    s = train(compose("run_name=rel"))
    folder = Path(s["run_dir"])
    assert run_lock.holder(folder) is None
    with pytest.raises(ConfigError, match="already holds a run"):
        train(compose("run_name=rel"))  # refused after taking the lock: released on the way out too
    assert run_lock.holder(folder) is None


def test_one_process_cannot_hold_a_folder_twice(tmp_path):
    with run_lock.acquire(tmp_path / "run"):
        with pytest.raises(run_lock.RunFolderBusy, match=rf"pid {os.getpid()}\b.*this same process"):
            run_lock.acquire(tmp_path / "run")


def test_a_derived_name_whose_folder_a_live_process_holds_is_not_reused(tmp_path):
    results = tmp_path / "results"
    folder = results / "default" / "grpo__s0"
    holder = _holder_process(folder)  # a run that locked its folder and has not written config.yaml yet
    try:
        assert run_name("grpo", 0, "", results_dir=results, experiment="default", resume=False) == "grpo__s0-2"
    finally:
        holder.kill()
        holder.wait()
    # once that process is gone the name is free again (a fresh key: run_name caches per Hydra job)
    assert run_name("grpo", 0, "", results_dir=results, experiment="default", resume="false") == "grpo__s0"


def test_a_folder_the_lock_made_and_nothing_wrote_to_is_removed_on_release(tmp_path):
    with run_lock.acquire(tmp_path / "a" / "b"):  # a run refused by a check after the lock
        assert (tmp_path / "a" / "b" / run_lock.LOCK_FILE).exists()
    assert not (tmp_path / "a").exists()
    with run_lock.acquire(tmp_path / "c"):
        (tmp_path / "c" / "config.yaml").write_text("seed: 0\n")
    assert (tmp_path / "c" / run_lock.LOCK_FILE).read_text() == "" and (tmp_path / "c" / "config.yaml").exists()
