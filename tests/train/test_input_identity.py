"""The identity of every input beyond the config (issue 62, point 2): fingerprint.json and summary.json record the
teacher (a run folder's checkpoint step and weights, a folder's files) and every plug-in module's source
(`rlcompare.train.inputs.external_inputs`); resume refuses when one changed, naming it; the report flags arms whose
inputs differ under one name. At 6c29db8 none of it was recorded: a teacher run folder that gained a checkpoint,
or a plug-in whose source changed, was read anew at the resume without a word."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST
from rlcompare.config import ConfigError, validate
from rlcompare.train import checkpoint
from rlcompare.train.inputs import differences, external_inputs
from rlcompare.train.run import train

QUICK = ["budget.max_steps=2", "budget.total_tokens=null", "trainer.checkpoint_every=1", "trainer.eval_every=1000"]


def _cut_back(run: Path, after: int) -> None:
    """As a kill after step `after` leaves the run: later rows and checkpoints gone, summary 'running'."""
    for f in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        if (run / f).exists():
            kept = [ln for ln in (run / f).read_text().splitlines(True) if json.loads(ln)["step"] <= after]
            (run / f).write_text("".join(kept))
    for c in checkpoint.candidates(run):
        if checkpoint.step_of(c) > after:
            shutil.rmtree(c)
    s = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**s, "status": "running"}))


# ----------------------------------------------------------------------------- the function
def test_the_default_config_has_no_external_inputs(compose):
    assert external_inputs(validate(compose())) == {}


def test_a_plugin_module_and_a_teacher_folder_are_identified_by_content(compose, tmp_path, monkeypatch):
    (tmp_path / "mine_plugin.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "model.safetensors").write_bytes(b"weights")
    (teacher / "config.json").write_text("{}")
    cfg = {"algorithm": {"module": "mine_plugin"}, "teacher": {"path": str(teacher)}, "env": {"target": None}}
    before = external_inputs(cfg)
    assert set(before) == {"algorithm.module", "teacher.path"}
    assert before["teacher.path"]["kind"] == "folder" and before["teacher.path"]["path"] == str(teacher.resolve())
    (tmp_path / "mine_plugin.py").write_text("X = 2\n")
    (teacher / "model.safetensors").write_bytes(b"other weights")
    changed = differences(before, external_inputs(cfg))
    assert [c.split(":")[0] for c in changed] == [
        "algorithm.module source_sha256",
        "teacher.path weights_sha256",
    ], changed
    # where the teacher lies is not what it is: the same files under another path are the same teacher
    moved = tmp_path / "moved"
    shutil.copytree(teacher, moved)
    assert differences(external_inputs(cfg), external_inputs({**cfg, "teacher": {"path": str(moved)}})) == []


def test_rlcompares_own_environment_module_is_not_an_input_but_a_verifiers_package_is():
    cfg = {
        "env": {
            "target": "rlcompare.envs.verifiers_adapter:VerifiersEnv",
            "settings": {"module": "json"},  # an importable top-level name standing in for a taskset package
        }
    }
    got = external_inputs(cfg)
    assert list(got) == ["env.settings.module"]
    assert got["env.settings.module"]["module"] == "json" and got["env.settings.module"]["source_sha256"]
    assert set(got["env.settings.module"]) == {"module", "distribution", "version", "source_sha256", "verifiers"}
    # env=verifiers by its registered name (env.name=verifiers, no target): the same record
    by_name = {"env": {"name": "verifiers", "target": None, "settings": {"module": "json"}}}
    assert external_inputs(by_name) == got


def test_every_module_a_config_imports_is_named_by_its_key():
    from rlcompare.train.inputs import plugin_modules

    cfg = {
        "algorithm": {"module": "mine.surrogate"},
        "verifier": {"module": None, "components": [{"name": "a", "module": "theirs"}, {"name": "format"}]},
        "env": {"module": "my_envs", "target": "my_env:Env"},
    }
    assert plugin_modules(cfg) == [
        ("algorithm.module", "mine.surrogate"),
        ("verifier.components.0.module", "theirs"),
        ("env.module", "my_envs"),
        ("env.target", "my_env"),
    ]


# ----------------------------------------------------------------------------- resume
@pytest.mark.slow
def test_a_teacher_run_folder_that_gains_a_checkpoint_refuses_the_resume(compose, tmp_path):
    teacher = Path(train(compose("budget.max_steps=1", "budget.total_tokens=null", "run_name=teacher"))["run_dir"])
    opd = ["algorithm=opd", f"teacher.path={teacher}", *QUICK, "run_name=opd"]
    done = train(compose(*opd))
    run = Path(done["run_dir"])
    fp = json.loads((run / "fingerprint.json").read_text())
    recorded = fp["inputs"]["teacher.path"]
    assert recorded["kind"] == "run" and recorded["checkpoint_step"] == 1 and recorded["weights_sha256"]
    assert done["inputs"] == fp["inputs"]  # summary.json too
    _cut_back(run, 1)
    newest = checkpoint.candidates(teacher)[0]
    shutil.copytree(newest, newest.with_name("step_00000002"))  # the teacher's run went on while ours was down
    with pytest.raises(ConfigError, match=r"teacher.path checkpoint_step: 1 in the run, 2 now"):
        train(compose(*opd, "resume=true"))
    assert json.loads((run / "summary.json").read_text())["status"] == "running"  # nothing of the run changed


def _rlcompare() -> list[str]:
    script = Path(sys.executable).parent / "rlcompare"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rlcompare.cli"]


@pytest.mark.slow
def test_a_plugin_whose_source_changed_refuses_the_resume_naming_it(tmp_path):
    """Through `rlcompare train` as a user runs it, the module beside them in the working folder."""
    (tmp_path / "my_idplugin.py").write_text("SHIFT = 0\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [*FAST, *QUICK, f"results_dir={tmp_path / 'results'}", "algorithm.module=my_idplugin", "run_name=r"]

    def rlcompare(*more):
        cmd = _rlcompare() + ["train", *args, *more]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    first = rlcompare()
    assert first.returncode == 0, first.stderr[-2000:]
    run = tmp_path / "results" / "default" / "r"
    assert json.loads((run / "fingerprint.json").read_text())["inputs"]["algorithm.module"]["source_sha256"]
    _cut_back(run, 1)
    (tmp_path / "my_idplugin.py").write_text("SHIFT = 1  # changed between the kill and the resume\n")
    again = rlcompare(f"resume={run}")
    assert again.returncode != 0
    assert "importing the modules" in again.stderr and "algorithm.module=my_idplugin" in again.stderr
    assert "algorithm.module source_sha256" in again.stderr and "put it back" in again.stderr, again.stderr[-2000:]
    (tmp_path / "my_idplugin.py").write_text("SHIFT = 0\n")  # as it was: the resume goes on
    back = rlcompare(f"resume={run}")
    assert back.returncode == 0, back.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
