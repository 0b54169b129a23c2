"""A plug-in verifier with a knob and declared metrics, from the shell (docs/api.md "Adding a verifier"): the knob
reaches the verifier, its metrics land in metrics.jsonl as verifier/<name> and in eval.jsonl as
eval/verifier/<name> with the values worked by hand, and a
metric it did not declare is refused before the model loads. Every run is a real `rlcompare train` process
started from the repository's root with the plug-in's folder on PYTHONPATH; the test process's registry is never
touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlcompare.results import read_jsonl

REPO = Path(__file__).resolve().parents[1]
QUICK = ["budget=tiny", "logger=none", "trainer.progress=false", "trainer.eval_every=1000", "prompts.n_eval=16"]
QUICK += ["trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.threads=1"]

PLUGIN = """
from dataclasses import dataclass

from rlcompare.rewards.pool import Score
from rlcompare.rewards.registry import knob, register_verifier
from rlcompare.rewards.verifiers import Verifier


@dataclass(frozen=True)
class ParitySettings:
    bonus: float = knob(0.0, "reward of a completion of even length")

    def check(self, where="verifier"):
        if not 0 <= self.bonus <= 1:
            raise ValueError(f"{where}.bonus={self.bonus!r} must be in [0, 1]")


@register_verifier("parity", settings=ParitySettings, metrics=("even", "bonus"))
class Parity(Verifier):
    def __init__(self, bonus=0.0):
        self.bonus = bonus

    def score(self, completion, answer):
        even = len(completion) % 2 == 0
        return Score(self.bonus if even else 0.0, even, metrics={"even": float(even), "bonus": self.bonus})


@register_verifier("sloppy")  # declares no metric, reports one
class Sloppy(Verifier):
    def score(self, completion, answer):
        ok = str(answer) in completion
        return Score(float(ok), ok, metrics={"oops": 1.0})
"""


def _train(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    (tmp / "parity_verifier.py").write_text(PLUGIN)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "rlcompare.cli", "train", *args, f"results_dir={tmp / 'results'}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # one tiny run of two steps: tens of seconds under load
def test_the_knob_reaches_the_verifier_and_its_metrics_reach_the_row(tmp_path):
    """Reward `bonus` on an even-length completion, else 0, and correct exactly then: so per step, by hand,
    verifier/bonus = 0.25 (every scoring reports the knob's value), verifier/even = accuracy/train (the share of
    even completions), and reward/mean = 0.25 x that share."""
    args = ["verifier.name=parity", "verifier.module=parity_verifier", "+verifier.bonus=0.25", "verifier.probe=false"]
    out = _train(args + QUICK + ["budget.max_steps=2", "run_name=parity"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "results" / "default" / "parity"
    rows = read_jsonl(run / "metrics.jsonl")
    assert len(rows) == 2
    for r in rows:
        assert r["verifier/bonus"] == 0.25
        assert r["verifier/even"] == pytest.approx(r["accuracy/train"], abs=1e-7)
        assert r["reward/mean"] == pytest.approx(0.25 * r["verifier/even"], abs=1e-7)
    assert yaml.safe_load((run / "config.yaml").read_text())["verifier"]["bonus"] == 0.25
    # and the held-out eval's rows: greedy, a completion is correct exactly when it is even, so eval/verifier/even
    # is eval/accuracy
    evals = read_jsonl(run / "eval.jsonl")
    assert len(evals) >= 2
    for r in evals:
        assert r["eval/verifier/bonus"] == 0.25
        assert r["eval/verifier/even"] == pytest.approx(r["eval/accuracy"], abs=1e-7)
    # sampled (4 per prompt): the share of even samples is avg@n, the greedy accuracy stays eval/accuracy
    out = _train(args + QUICK + ["budget.max_steps=1", "eval.samples=4", "run_name=sampled"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for r in read_jsonl(tmp_path / "results" / "default" / "sampled" / "eval.jsonl"):
        assert r["eval/verifier/bonus"] == 0.25
        assert r["eval/verifier/even"] == pytest.approx(r["eval/avg@n"], abs=1e-7)
    # the plug-in's own check, through the shell, names the key before anything runs
    out = _train(args[:2] + ["+verifier.bonus=1.5", "run_name=bad"] + QUICK, tmp_path)
    assert out.returncode == 2 and "verifier.bonus=1.5 must be in [0, 1]" in out.stderr
    assert not (tmp_path / "results" / "default" / "bad").exists()


@pytest.mark.slow  # a process that stops at the probe (no model): seconds
def test_a_metric_the_verifier_does_not_declare_is_refused_before_training(tmp_path):
    out = _train(["verifier.name=sloppy", "verifier.module=parity_verifier", "run_name=sloppy"] + QUICK, tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "verifier 'sloppy' reported metric 'oops', which it does not declare (declared: none)" in out.stderr
    assert not (tmp_path / "results" / "default" / "sloppy").exists()
