"""Foreign folders are data (issue 62, point 4): `rlcompare export <run>` and `teacher.path=<run folder>` read the
folder's config.yaml without importing a module it names (algorithm.module, verifier.module, env.module, env.target) and never
with its model.trust_remote_code; a run folder holding code is refused as a teacher. At 6c29db8 both called
`validate` on that config.yaml, which imported the payload (found through the working-directory retry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import FAST
from rlcompare.config import ConfigError, validate
from rlcompare.config.foreign import read_run_config
from rlcompare.train.run import train
from rlcompare.train.teacher_check import check_teacher

PAYLOADS = ("payload_algo", "payload_verifier", "payload_env", "payload_env_module")


@pytest.fixture
def run_folder(compose, tmp_path) -> Path:
    """A real one-step run with its checkpoint."""
    done = train(compose("budget.max_steps=1", "budget.total_tokens=null", "run_name=theirs"))
    return Path(done["run_dir"])


def _plant(run: Path, cwd: Path) -> Path:
    """The run's config.yaml names payload modules that sit in `cwd` (where the user stands) and trusts remote
    code; each payload would append its name to the returned marker file."""
    marker = cwd / "PAYLOAD_RAN"
    for name in PAYLOADS:
        (cwd / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\nclass Env: pass\n")
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.algorithm.module, cfg.verifier.module = "payload_algo", "payload_verifier"
    cfg.env.name, cfg.env.target, cfg.env.module = "custom", "payload_env:Env", "payload_env_module"
    cfg.model.trust_remote_code = True
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    return marker


def _rlcompare(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlcompare"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlcompare.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_export_of_a_crafted_run_folder_runs_none_of_its_modules(run_folder, tmp_path):
    marker = _plant(run_folder, tmp_path)
    done = _rlcompare(tmp_path, "export", str(run_folder), "--out", str(tmp_path / "exported"))
    assert not marker.exists(), f"payload ran: {marker.read_text()}"
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "exported" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_crafted_run_folder_as_teacher_runs_none_of_its_modules(run_folder, tmp_path):
    marker = _plant(run_folder, tmp_path)
    args = [*FAST, "budget.max_steps=1", "budget.total_tokens=null", f"results_dir={tmp_path / 'opd'}"]
    done = _rlcompare(tmp_path, "train", *args, "algorithm=opd", f"teacher.path={run_folder}")
    assert not marker.exists(), f"payload ran: {marker.read_text()}"
    assert done.returncode == 0, done.stderr[-2000:]
    (summary,) = (tmp_path / "opd").glob("*/*/summary.json")
    assert json.loads(summary.read_text())["inputs"]["teacher.path"]["checkpoint_step"] == 1


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_run_folder_read_as_data_keeps_what_an_export_needs(run_folder, tmp_path):
    own = validate(OmegaConf.load(run_folder / "config.yaml"))
    _plant(run_folder, tmp_path)
    read = read_run_config(run_folder / "config.yaml", "export")
    assert read.model.trust_remote_code is False and read.algorithm.module is None and read.env.name == "none"
    assert read.verifier.module is None and read.teacher.path is None and read.env.module is None
    for section in ("model", "prompts", "budget", "rollout"):  # what export rebuilds the policy from
        want = OmegaConf.to_container(own[section], resolve=True)
        got = OmegaConf.to_container(read[section], resolve=True)
        assert got == ({**want, "trust_remote_code": False} if section == "model" else want), section
    (run_folder / "config.yaml").write_text("model:\n  name: ${oc.env:HOME}\n")
    with pytest.raises(ConfigError, match="interpolations"):
        read_run_config(run_folder / "config.yaml", "export")


@pytest.mark.parametrize("where", ["evil.py", "checkpoints/evil.py", "weights.pt"])
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_run_folder_holding_code_or_pickles_is_refused_as_teacher(compose, run_folder, tmp_path, where):
    (run_folder / where).write_text("open('/tmp/never', 'w')\n")
    cfg = validate(compose("algorithm=opd", f"teacher.path={run_folder}"))
    with pytest.raises(ConfigError, match=r"run folder holding code or pickle files .*" + Path(where).name):
        check_teacher(cfg)


def _code_model_folder(folder: Path, marker: Path) -> Path:
    """A model folder whose config and tokenizer map to code in it (auto_map): run only when trusted."""
    folder.mkdir()
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (folder / "config.json").write_text(json.dumps({"model_type": "rlc_evil", "auto_map": {"AutoConfig": "evil.C"}}))
    tok = {"auto_map": {"AutoTokenizer": ["evil.T", None]}, "tokenizer_class": "T"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder


def _trusting(run: Path, model_folder: Path) -> None:
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.model.kind, cfg.model.name_or_path, cfg.model.trust_remote_code = "hf", str(model_folder), True
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))


@pytest.mark.slow
def test_export_never_uses_a_run_folders_trust_remote_code(run_folder, tmp_path):
    marker = tmp_path / "MODEL_CODE_RAN"
    _trusting(run_folder, _code_model_folder(tmp_path / "code_model", marker))
    done = _rlcompare(tmp_path, "export", str(run_folder), "--out", str(tmp_path / "exported"))
    assert not marker.exists()
    assert done.returncode == 2 and "trust_remote_code is never used" in done.stderr, done.stderr[-2000:]


def test_a_teacher_run_folders_trust_remote_code_is_never_used(compose, run_folder, tmp_path):
    marker = tmp_path / "MODEL_CODE_RAN"
    _trusting(run_folder, _code_model_folder(tmp_path / "code_model", marker))
    cfg = validate(compose("algorithm=opd", f"teacher.path={run_folder}"))
    with pytest.raises(ConfigError, match="tokenizer could not be loaded"):
        check_teacher(cfg)  # the pre-check reads the teacher's tokenizer (its code, at 6c29db8)
    assert not marker.exists()
