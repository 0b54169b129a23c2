"""sweeps/gym_countdown.yaml (GRPO, Dr. GRPO, DAPO, GSPO on reasoning-gym's Countdown): the CPU variant its header
gives runs here on the embedded tiny model, the command exactly as written in the file."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from rlcompare.sweep import main as sweep_main
from rlcompare.train.tracking import read_jsonl

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "gym_countdown.yaml"


def cpu_command() -> list[str]:
    """The header's CPU command, as arguments after `rlcompare sweep`."""
    lines = [ln.lstrip("# ").strip() for ln in SWEEP.read_text().splitlines() if ln.startswith("#")]
    (line,) = [ln for ln in lines if ln.startswith("rlcompare sweep") and "model=tiny" in ln]
    return shlex.split(line)[2:]


def test_the_cpu_variant_is_a_one_seed_tiny_run_of_the_same_file():
    args = cpu_command()
    assert args[0] == "sweeps/gym_countdown.yaml" and "model=tiny" in args and args[args.index("--seeds") + 1] == "0"
    assert "results_dir=results/cpu" in args  # apart from the GPU sweep's results


@pytest.mark.slow
def test_the_cpu_variant_runs_every_member(tmp_path, monkeypatch):
    monkeypatch.chdir(SWEEP.parents[1])
    args = [a for a in cpu_command() if not a.startswith("results_dir=")]
    args += [f"results_dir={tmp_path}", "logger=none", "trainer.threads=1", "trainer.progress=false"]
    args += ["trainer.unhealthy=warn"]  # a 2-step tiny run solves nothing: no learning signal (docs/metrics.md)
    assert sweep_main(args) == 0
    runs = sorted(p.name for p in (tmp_path / "gym_countdown").iterdir() if (p / "summary.json").exists())
    assert runs == ["dapo__s0", "drgrpo__s0", "grpo__s0", "gspo__s0"]
    for run in runs:
        rows = read_jsonl(tmp_path / "gym_countdown" / run / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2]
