"""`env=verifiers` the user's way (#62): an environment package (tests/envs/vf_guess_pkg) installed with pip into a
folder of its own, put on the path, its tasks exported with the documented command, and `rlcompare train
env=verifiers ...` run as a subprocess. At 6c29db8 every episode ended `env/errors/no_worker` (the worker could
not unpickle the composed config's `env.settings.env_args` node) and the run said "completed" on 0 tokens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlcompare.train.tracking import read_jsonl

from test_reliability import REPO, _cli, _env

pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed (pip install .[verifiers])")
pytest.importorskip("setuptools", reason="the test package is built with setuptools, without build isolation")

PACKAGE = REPO / "tests" / "envs" / "vf_guess_pkg"


def _install(tmp_path: Path) -> str:
    """pip install the package (offline: its dependency, verifiers, is already installed) into a folder of its own."""
    site, source = tmp_path / "site", tmp_path / "pkg"
    shutil.copytree(PACKAGE, source)  # setuptools writes build/ beside the source: a copy keeps the checkout clean
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, cwd=tmp_path, timeout=300)
    assert (site / "rlc_vf_guess" / "__init__.py").is_file()
    return str(site)


@pytest.mark.slow
def test_a_verifiers_environment_package_trains_through_the_cli(tmp_path):
    path = os.pathsep.join([_install(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**_env(WANDB_MODE="offline"), "PYTHONPATH": path}
    export = "from rlcompare.envs.verifiers_adapter import export_prompts; export_prompts('sums.jsonl', 'rlc_vf_guess')"
    subprocess.run([sys.executable, "-c", export], check=True, cwd=tmp_path, env=env, timeout=300)
    assert json.loads((tmp_path / "sums.jsonl").read_text().splitlines()[3]) == {"question": "3+3=", "answer": "3"}
    argv = _cli(
        "env=verifiers",
        "env.settings.module=rlc_vf_guess",
        "+env.settings.env_args.n=24",  # a field of the taskset's config: an OmegaConf node in the composed config
        "prompts.kind=file",
        "prompts.path=sums.jsonl",
        "prompts.eval_fraction=0.25",
        "+verifier.workers=1",  # one worker importing verifiers (about 12 s): several thrash a busy 2-core host
        "verifier.timeout_s=60",  # generous bounds for a busy host: every episode must finish
        "verifier.batch_timeout_s=300",
        "budget.max_steps=2",
        f"results_dir={tmp_path / 'results'}",
        "run_name=vf",
    )
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "results" / "default" / "vf"
    rows = read_jsonl(run / "metrics.jsonl")
    assert len(rows) == 2
    for r in rows:  # 4 prompts x 4 episodes a step (FAST), each ended by the env, none by an error
        assert r["tokens/generated"] > 0 and r["tokens/env"] > 0
        assert r["env/errors"] == 0, {k: v for k, v in r.items() if k.startswith("env/")}
        assert r["env/ends/done"] + r["env/ends/max_turns"] + r["env/ends/budget"] == 16
        assert r["accuracy/train"] == pytest.approx(r["reward/mean"])  # 0/1 rewards, correct = reward > 0
    evals = read_jsonl(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and all("eval/accuracy" in e for e in evals)
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
