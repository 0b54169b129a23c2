"""A plug-in environment from the shell: `env.name=retry env.module=examples.retry_env` (docs/api.md "Adding an
environment"), run as a user types it (a real `rlcompare train` process from the repository's root; the test
process's own registry is never touched): the run is healthy by run health, the knob reaches the episodes, the
module's source is part of the run's inputs; a bad knob and a module registering a built-in's name are refused
before a run folder exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcompare.results import read_jsonl

REPO = Path(__file__).resolve().parents[1]
PLUGIN = ["env.name=retry", "env.module=examples.retry_env"]
TINY = ["budget=tiny", "budget.max_steps=2", "logger=none", "trainer.progress=false", "trainer.threads=1"]
TINY += ["trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.eval_every=1000", "prompts.n_eval=16"]


def _run(args: list[str], tmp: Path, timeout: int = 300, path: str = "") -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlcompare"  # the console script: the working directory not on its path
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlcompare.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
    return subprocess.run(cmd + ["train", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # about a minute on a busy 2-core host
def test_the_example_environment_trains_healthy_through_the_shell(tmp_path):
    results = tmp_path / "results"
    out = _run([*PLUGIN, "+env.settings.decay=0.5", *TINY, f"results_dir={results}", "run_name=retry"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run = results / "default" / "retry"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["health"]["broken"] == []
    assert "env_single_turn" in summary["health"]["checked"]  # an environment's run, checked as one
    assert summary["inputs"]["env.module"]["module"] == "examples.retry_env"
    assert summary["inputs"]["env.module"]["source_sha256"]
    rows = read_jsonl(run / "metrics.jsonl")
    assert len(rows) == 2 and all(r["env/errors"] == 0 and r["env/turns_mean"] > 1 for r in rows)
    # each episode earns 1, 0.5, 0.25 or 0 (right at the first, second, third try, or never): 16 episodes a step
    for r in rows:
        assert (r["reward/mean"] * 16 * 4).is_integer()
    # a right answer after a retry earns less than 1: the knob reached the episodes (decay 1 would make them equal)
    assert any(r["reward/mean"] < r["accuracy/train"] for r in rows)
    # its declared metric reached the row: the env answers every policy turn, so with no error its mean `tries`
    # is the mean number of policy turns, which rlcompare counts on its own side
    for r in rows:
        assert r["env/retry/tries"] == pytest.approx(r["env/turns_mean"], abs=1e-6)


@pytest.mark.slow
def test_a_bad_knob_and_a_taken_name_are_refused_before_a_run_folder(tmp_path):
    results = tmp_path / "results"
    out = _run([*PLUGIN, "+env.settings.decay=2", f"results_dir={results}"], tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "env.settings.decay=2 must be in [0, 1]" in out.stderr
    out = _run([*PLUGIN, "+env.settings.decai=0.5", f"results_dir={results}"], tmp_path)
    assert (
        out.returncode == 2 and "env.settings.decai is not a setting of env.name=retry; accepted: decay" in out.stderr
    )
    # a module that registers a built-in's name: refused, naming the built-in's module and its own
    (tmp_path / "mine_calc.py").write_text(
        "from rlcompare.env_specs import EnvSpec, register_environment\n\n"
        "@register_environment(EnvSpec('calc'))\nclass Mine:\n    pass\n"
    )
    out = _run(["env=calc", "env.module=mine_calc", f"results_dir={results}"], tmp_path, path=str(tmp_path))
    assert out.returncode == 2, out.stderr[-2000:]
    assert (
        "name 'calc' is registered already (by rlcompare.env_specs); mine_calc cannot register it again" in out.stderr
    )
    assert not results.exists()
