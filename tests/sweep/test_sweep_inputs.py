"""`rlcompare sweep --resume` checks every run it keeps or continues against the external inputs its member names now
(issue 62, point 2): a teacher's files or checkpoint step, a plug-in module's source. Before, a completed run was kept
without a look and a run to continue was refused only by its own `rlcompare train resume=true`, after the sweep had
launched (and trained) the others; now the sweep is refused before anything trains, naming the run, the input and
the fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.conftest import FAST
from rlcompare.sweep import launch as sw_launch
from rlcompare.sweep import SweepError, run_sweep
from rlcompare.train.inputs import external_inputs

OPD_SWEEP = """
    name: opdin
    seeds: [0]
    base: {label: opd, overrides: [algorithm=opd, "teacher.path={teacher}"]}
    variants:
      - {label: opd_clip, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
"""


def _finish(root: Path, job, status: str = "completed") -> None:
    """What a run of `job` leaves (rlcompare.train.run): its config.yaml, a final summary and a fingerprint.json
    whose `inputs` are what the member's config named when it ran."""
    d = root / f"{job.member.name}__s{job.seed}"
    (d / ".hydra").mkdir(parents=True, exist_ok=True)
    (d / ".hydra" / "overrides.yaml").write_text("[]\n")
    (d / "config.yaml").write_text(yaml.safe_dump({**job.member.config, "seed": job.seed}))
    (d / "summary.json").write_text(json.dumps({"status": status, "error": None}))
    (d / "fingerprint.json").write_text(json.dumps({"inputs": external_inputs(job.member.config)}))


def _opd_sweep(tmp_path):
    """A teacher folder (weights v1), the OPD sweep file naming it, and the overrides that put results in tmp_path."""
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text("{}")
    (teacher / "model.safetensors").write_bytes(b"weights v1")
    p = tmp_path / "opdin.yaml"
    p.write_text(textwrap.dedent(OPD_SWEEP.replace("{teacher}", str(teacher))))
    return teacher, p, [f"results_dir={tmp_path / 'results'}"]


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_teacher_changed_since_the_runs_refuses_the_resume_before_anything_trains(tmp_path, monkeypatch):
    teacher, p, extra = _opd_sweep(tmp_path)
    root = tmp_path / "results" / "opdin"

    def first(spec, r, jobs, hx):  # the base completes; the variant fails after its first checkpoint
        _finish(r, jobs[0])
        _finish(r, jobs[1], status="failed")
        (r / "opd_clip__s0" / "checkpoints" / "step_00000001").mkdir(parents=True)
        return 1

    monkeypatch.setattr(sw_launch, "launch_jobs", first)
    assert run_sweep(p, extra) == 1
    launches = []
    monkeypatch.setattr(sw_launch, "launch_jobs", lambda spec, r, jobs, hx: launches.append(jobs) or 0)

    (teacher / "model.safetensors").write_bytes(b"weights v2")  # the teacher's weights replaced under its path
    with pytest.raises(SweepError) as refused:
        run_sweep(p, extra, resume=True)
    msg = str(refused.value)
    # both runs named: the completed one it would keep, the failed one it would continue from its checkpoint
    assert "opd__s0 (teacher.path weights_sha256:" in msg and "opd_clip__s0 (teacher.path weights_sha256:" in msg
    assert "put it back as it was" in msg and "another results_dir" in msg
    assert launches == [] and not (root / ".jobs.yaml").exists()

    (teacher / "model.safetensors").write_bytes(b"weights v1")  # put back: the sweep continues the failed run
    assert run_sweep(p, extra, resume=True) == 1  # (the fake launch settles nothing)
    assert [[(j.member.name, j.resume) for j in batch] for batch in launches][0] == [("opd_clip", True)]


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_run_that_starts_over_is_not_checked(tmp_path, monkeypatch):
    """A failed run without a checkpoint starts from step 0 with the inputs of now: what it recorded is not kept."""
    teacher, p, extra = _opd_sweep(tmp_path)

    def first(spec, r, jobs, hx):
        _finish(r, jobs[0], status="failed")
        _finish(r, jobs[1], status="failed")
        return 1

    monkeypatch.setattr(sw_launch, "launch_jobs", first)
    assert run_sweep(p, extra) == 1
    (teacher / "model.safetensors").write_bytes(b"weights v2")
    launches = []
    monkeypatch.setattr(sw_launch, "launch_jobs", lambda spec, r, jobs, hx: launches.append(jobs) or 0)
    assert run_sweep(p, extra, resume=True) == 1
    assert len(launches[0]) == 2


# ----------------------------------------------------------------------------- the user's way
PLUGIN_SWEEP = """
    name: plugin
    seeds: [0]
    base: {label: mine, overrides: [algorithm.module=my_sweepplug]}
    variants:
      - {label: mine_clip, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
"""
QUICK = ["budget.max_steps=2", "budget.total_tokens=null", "trainer.checkpoint_every=1", "trainer.eval_every=1000"]


def _cut_back(run: Path) -> None:
    """As a kill after step 1 leaves the run: its step-2 rows and checkpoint gone, summary "running"."""
    for f in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        if (run / f).exists():
            kept = [ln for ln in (run / f).read_text().splitlines(True) if json.loads(ln)["step"] <= 1]
            (run / f).write_text("".join(kept))
    shutil.rmtree(run / "checkpoints" / "step_00000002")
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "running"}))


@pytest.mark.slow
def test_a_plugin_changed_between_sweep_launches_refuses_the_resume_through_the_cli(tmp_path):
    """`rlcompare sweep` as a user runs it, the plug-in module beside the sweep file in the working folder: the
    sweep completes; the module's source changes; `--resume` exits 2 naming the run and the input, launching
    nothing; with the source put back, `--resume` keeps both runs."""
    (tmp_path / "my_sweepplug.py").write_text("SHIFT = 0\n")
    (tmp_path / "plugin.yaml").write_text(textwrap.dedent(PLUGIN_SWEEP))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [*FAST, *QUICK, f"results_dir={tmp_path / 'results'}"]

    def sweep(*more):
        cmd = [sys.executable, "-m", "rlcompare.cli", "sweep", "plugin.yaml", *args, *more]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    first = sweep()
    assert first.returncode == 0, first.stderr[-3000:]
    root = tmp_path / "results" / "plugin"
    _cut_back(root / "mine_clip__s0")  # killed after step 1: --resume continues it from its checkpoint
    stamps = {d.name: (d / "summary.json").stat().st_mtime_ns for d in root.iterdir() if d.is_dir()}

    (tmp_path / "my_sweepplug.py").write_text("SHIFT = 1  # changed between the launches\n")
    again = sweep("--resume")
    assert again.returncode == 2, again.stderr[-3000:]
    err = again.stderr
    assert "mine__s0 (algorithm.module source_sha256:" in err and "mine_clip__s0 (algorithm.module" in err
    assert "put it back as it was" in err and "launching" not in err
    assert stamps == {d.name: (d / "summary.json").stat().st_mtime_ns for d in root.iterdir() if d.is_dir()}

    (tmp_path / "my_sweepplug.py").write_text("SHIFT = 0\n")  # as it was: the sweep goes on
    back = sweep("--resume")
    assert back.returncode == 0, back.stderr[-3000:]
    assert "launching 1 job(s): mine_clip__s0 (resume)" in back.stderr
    assert json.loads((root / "mine_clip__s0" / "summary.json").read_text())["status"] == "completed"
