"""`python -m rlcompare.bench.engine` (issue #53): the torch-only engine bench of scripts/gpu_check.sh part 1, at
its CPU-test shape."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlcompare.bench import engine

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _args(**kw):
    base = dict(size="qwen2.5-0.5b", rows=128, new=512, engines="eager,graphs", device="cpu", layers=None,
                small=True, profile=False, json=True, save=None, autocast="auto")  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_the_small_bench_decodes_every_row_to_the_end_in_both_engines_and_reports_its_rate():
    out = engine.run(_args())
    assert (out["rows"], out["new_tokens"], out["vocab"], out["layers"]) == (8, 16, 512, 2)
    for name in ("eager", "graphs"):
        r = out[name]
        # 8 rows x 16 tokens in the timed rollout; ms per step is its seconds over the 16 steps
        assert r["tokens_per_s"] * r["rollout_s"] == pytest.approx(128)
        assert r["ms_per_step"] == pytest.approx(1000 * r["rollout_s"] / 16)
        assert r["peak_gib"] is None  # the CPU: no GPU peak
    assert out["graphs_over_eager"] == pytest.approx(out["graphs"]["tokens_per_s"] / out["eager"]["tokens_per_s"])
    assert "graphs / eager:" in engine.report(out)


@pytest.mark.slow  # tens of seconds under load (issue 63: -m 'not slow' under 5 min)
def test_the_profile_counts_a_whole_number_of_ops_per_step_growing_by_the_same_count_per_layer():
    """Two rollouts of 4 and 12 tokens cancel the prefill: a step's count is exact, and each layer adds the same
    ops (so 3 layers minus 2 equals 2 minus 1)."""
    per = {}
    for layers in (1, 2, 3):
        p = engine.ops_per_step(*_small(layers), None)
        assert p["kernels_per_step"] is None
        per[layers] = p["aten_ops_per_step"], p["leaf_ops_per_step"]
        assert all(n == int(n) > 0 for n in per[layers])
        assert per[layers][1] > per[layers][0]  # a linear's call holds its product
    for i in (0, 1):
        assert per[3][i] - per[2][i] == per[2][i] - per[1][i] > 0


def _small(layers):
    model, spec = engine.build_model("qwen2.5-tiny", "cpu", layers=layers, vocab=512)
    return model, torch.randint(1, 512, (1, engine.PROMPT), generator=torch.Generator().manual_seed(0))


def test_rows_not_a_multiple_of_the_group_are_refused_in_one_line():
    with pytest.raises(SystemExit, match="--rows 12 must be a multiple of the group size 8"):
        engine.run(_args(small=False, rows=12))


@pytest.mark.slow  # tens of seconds under load (issue 63: -m 'not slow' under 5 min)
def test_the_command_prints_one_json_line():
    cmd = [sys.executable, "-m", "rlcompare.bench.engine", "--small", "--json", "--engines", "graphs"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["graphs"]["tokens_per_s"] > 0 and "eager" not in row
