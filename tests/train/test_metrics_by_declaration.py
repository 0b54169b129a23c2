"""Metrics reach the row by declaration (issue 64): what the loss, the surrogate's spec and the advantage
estimator's spec report is in metrics.jsonl and in docs/metrics.md, with no allow-list in between. DHPO's sequence
branch and PPO's explained variance through `rlcompare train`, as a user runs them."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcompare import registry
from rlcompare.algos import estimator_specs, losses, surrogate_specs
from rlcompare.algos.advantage.gae import explained_variance
from rlcompare.results import read_jsonl
from rlcompare.rewards import registry as rewards_registry

REPO = Path(__file__).resolve().parents[2]
QUICK = ["budget=tiny", "budget.max_steps=1", "logger=none", "trainer.eval_every=1000", "trainer.progress=false"]


def _train(tmp: Path, name: str, *overrides: str) -> list[dict]:
    script = Path(sys.executable).parent / "rlcompare"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlcompare.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    args = [*QUICK, *overrides, f"results_dir={tmp / 'results'}", "experiment=m", f"run_name={name}"]
    out = subprocess.run(cmd + ["train", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return read_jsonl(tmp / "results" / "m" / name / "metrics.jsonl")


def test_explained_variance_by_hand():
    """returns [1, 2, 4], values [1, 2, 3]: Var(returns) = 42/27, Var(returns - values) = Var([0, 0, 1]) = 6/27,
    EV = 1 - 6/42 = 0.857143; a padded position changes nothing; constant returns: nan."""
    mask = torch.tensor([[1, 1, 1, 0]])
    got = explained_variance(torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1.0, 2.0, 4.0, -5.0]]), mask)
    assert got == pytest.approx(1 - 6 / 42, abs=1e-12)
    assert math.isnan(explained_variance(torch.ones(1, 3), torch.ones(1, 3), torch.ones(1, 3)))


def test_every_declared_metric_is_in_docs_metrics_md():
    doc = (REPO / "docs" / "metrics.md").read_text()
    names = set(losses.ROW_NAMES.values()) | set(losses.SEQ_RATIO_NAMES.values())
    # the built-ins' (a plug-in another test registered documents its own)
    ours = lambda kind, n: (registry.owner(kind, n) or "").startswith("rlcompare.")  # noqa: E731
    names |= {f"policy/{k}" for n, s in surrogate_specs.SPECS.items() if ours("surrogate", n) for k in s.metrics}
    names |= {k for n, s in estimator_specs.SPECS.items() if ours("advantage estimator", n) for k in s.metrics}
    names |= {"verifier/<name>"}  # a verifier's declared metrics (weighted's depend on its components)
    rewards_registry.names()  # the built-in verifiers registered
    names |= {
        f"verifier/{m}"
        for n, s in rewards_registry.REGISTRY.items()
        if ours("verifier", n) and not callable(s.metrics)
        for m in s.metrics
    }
    missing = sorted(n for n in names if f"`{n}`" not in doc and f"`{n.rsplit('_', 1)[0]}" not in doc)
    assert not missing, f"docs/metrics.md lacks {missing}"


@pytest.mark.slow
def test_dhpo_rows_carry_the_sequence_branch_and_ppo_rows_the_critics_explained_variance(tmp_path):
    dhpo = _train(tmp_path, "dhpo", "algorithm=dhpo")
    row = dhpo[-1]
    for key in ("policy/seq_clip_frac_low", "policy/seq_clip_frac_high", "policy/mix_weight_mean"):
        assert 0.0 <= row[key] <= 1.0, (key, row.get(key))
    assert row["policy/mix_weight_mean"] == pytest.approx(0.5)  # mix: mean
    assert row["ratio/seq_min"] <= row["ratio/seq_mean"] <= row["ratio/seq_max"]
    ppo = _train(tmp_path, "ppo", "algorithm=ppo")
    ev = ppo[-1]["critic/explained_var"]
    assert ev is None or ev <= 1.0  # nan (constant returns) is written as null
    assert "critic/explained_var" in ppo[-1]
