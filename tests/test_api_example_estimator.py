"""The example advantage estimator (examples/median_baseline.py, docs/api.md "Adding an advantage estimator"):
its math by hand, its declared needs refusing a bad config, its metric in the row, through `rlcompare train`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcompare.algos import objective
from rlcompare.results import read_jsonl

REPO = Path(__file__).resolve().parents[1]
PLUGIN = ["algorithm.module=examples.median_baseline", "algorithm.advantage.estimator=median"]
PLUGIN += ["algorithm.advantage.scale=none"]
QUICK = ["budget=tiny", "budget.max_steps=1", "logger=none", "trainer.eval_every=1000", "trainer.progress=false"]


def _run(args: list[str], tmp: Path):
    script = Path(sys.executable).parent / "rlcompare"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlcompare.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    return subprocess.run(cmd + ["train", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_the_median_baseline_by_hand():
    """Group [0, 1, 10]: median 1, A = [-1, 0, 9] (GRPO's mean 11/3 would give all three a large shift); group
    [2, 2, 5, 7] (even: the lower middle, 2): A = [0, 0, 3, 5]."""
    import examples.median_baseline  # noqa: F401 (registers "median")

    got = objective.advantages("median", torch.tensor([0.0, 1.0, 10.0]), torch.ones(3, 2), group_size=3, scale="none")
    torch.testing.assert_close(got.advantages, torch.tensor([-1.0, 0.0, 9.0]))
    assert got.metrics == {"median/zero_frac": pytest.approx(1 / 3)}
    got = objective.advantages(
        "median", torch.tensor([2.0, 2.0, 5.0, 7.0]), torch.ones(4, 2), group_size=4, scale="none"
    )
    torch.testing.assert_close(got.advantages, torch.tensor([0.0, 0.0, 3.0, 5.0]))


@pytest.mark.slow
def test_the_example_estimator_through_the_shell(tmp_path):
    # its declared needs: groups, so trainer.group_size=1 is refused before a run folder
    out = _run(PLUGIN + QUICK + ["trainer.group_size=1", f"results_dir={tmp_path / 'r'}"], tmp_path)
    assert out.returncode == 2 and "trainer.group_size=1 with algorithm.advantage.estimator=median" in out.stderr
    # its scale: only none
    out = _run(PLUGIN[:2] + QUICK + [f"results_dir={tmp_path / 'r'}"], tmp_path)
    assert out.returncode == 2 and "algorithm.advantage.scale" in out.stderr
    assert not (tmp_path / "r").exists()
    out = _run(PLUGIN + QUICK + [f"results_dir={tmp_path / 'r'}", "experiment=e", "run_name=m"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    row = read_jsonl(tmp_path / "r" / "e" / "m" / "metrics.jsonl")[-1]
    assert 0.0 <= row["median/zero_frac"] <= 1.0  # its declared metric, in the row by declaration
