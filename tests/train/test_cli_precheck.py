"""`rlcompare train` checks every job of its command line before Hydra makes a folder and before torch is imported
(issue 18): a bad value fails with one `config error: <key>=<value> ...` line, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcompare.train.precheck import check_train_args

REPO = Path(__file__).resolve().parents[2]

# Runs `rlcompare train ARGS` in a fresh interpreter and reports whether torch/transformers got imported.
PROBE = """
import sys
from rlcompare.cli import main
try:
    rc = main(["train", *sys.argv[1:]])
except SystemExit as e:
    rc = e.code
print(f"rc={rc} torch={'torch' in sys.modules} transformers={'transformers' in sys.modules}")
"""


def _train(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["trainer.lr=inf"],
            "rlcompare: config error: trainer.lr=inf is not a finite number; use a finite number in (0, 1]",
        ),
        (["model.num_heads=0"], "rlcompare: config error: model.num_heads=0 must be >= 1"),
        (
            ["run_name=../../escaped"],
            "rlcompare: config error: run_name='../../escaped' must be one folder name inside results_dir",
        ),
        # Hydra created the run folder first and failed with its raw mkdir traceback
        (["results_dir=a_file/results"], "rlcompare: config error: results_dir='a_file/results' is not writable"),
        (["hydra.run.dir=/proc/rlc-run"], "rlcompare: config error: hydra.run.dir='/proc/rlc-run' is not writable"),
        # a verifier that cannot score the prompts: before, 4 s of imports and (exact_match) a 300-step warm start first
        (
            ["verifier=countdown"],
            "rlcompare: config error: prompts=arithmetic verifier=countdown: the verifier cannot score "
            "this prompt set: 8 of 8 correct answers",
        ),
        (
            ["prompts=countdown", "verifier=exact_match"],
            "rlcompare: config error: prompts=countdown verifier=exact_match: "
            "the verifier cannot score this prompt set",
        ),
        (["verifier.name=nope"], "rlcompare: config error: verifier.name='nope' is not a known verifier; use one of:"),
        # a misspelt reasoning-gym dataset: its verifier runs in workers (no probe), so the job made a folder first
        (
            ["prompts=reasoning_gym", "prompts.task=countdwn", "verifier=reasoning_gym"],
            "rlcompare: config error: prompts.task='countdwn' is not a reasoning-gym dataset; use one of: ab, acre,",
        ),
        (
            ["prompts=reasoning_gym", "+prompts.task_config={min_terms: 5, max_terms: 2}", "verifier=reasoning_gym"],
            'rlcompare: config error: prompts.task_config={"min_terms": 5, "max_terms": 2} is not accepted by '
            "reasoning-gym's",
        ),
        (
            ["prompts=countdown_file", "prompts.path=missing.jsonl"],
            "rlcompare: config error: prompts.path='missing.jsonl': file not found",
        ),
        # a multirun is refused whole, before its first job, naming the bad job
        (
            ["-m", "seed=0,1", "trainer.lr=1e-3,nan"],
            "rlcompare: config error: trainer.lr=nan is not a finite number; use a "
            "finite number in (0, 1] (multirun job seed=0 trainer.lr=nan)",
        ),
    ],
)
@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_bad_value_fails_before_hydra_and_torch_with_one_line(tmp_path, args, line):
    (tmp_path / "a_file").write_text("not a folder")
    out = _train(tmp_path, *args)
    assert "rc=2 torch=False transformers=False" in out.stdout, out.stdout + out.stderr[-2000:]
    assert out.stderr.startswith(line), out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # no results/, no .hydra, no outputs/


REPO_CONF = Path(__file__).resolve().parents[2] / "conf"  # every preset there is an option Hydra lists


@pytest.mark.parametrize(
    "argv,start,pieces",
    [
        (
            ["algorithm=nope"],
            "algorithm=nope: In 'config': Could not find 'algorithm/nope'",
            [
                "Available options in 'algorithm': "
                + ", ".join(sorted(p.stem for p in (REPO_CONF / "algorithm").glob("*.yaml")))
            ],
        ),
        (
            ["trainer.lr_rate=1"],
            "trainer.lr_rate=1: unknown config key 'trainer.lr_rate'",
            ["not in struct", "accepted keys here: ", " lr,"],
        ),
        # a schema key the preset's YAML leaves out: Hydra's own hint (+key) is kept
        (
            ["verifier.max_chars=0"],
            "verifier.max_chars=0: Could not override 'verifier.max_chars'",
            ["use +verifier.max_chars=0"],
        ),
        (["trainer.lr=[1"], "trainer.lr=[1: Hydra cannot parse this override", ["no viable alternative"]),
        (["seed=0,1"], "seed=0,1: Ambiguous value for argument 'seed=0,1'", ["add --multirun"]),
        (["seed=abc"], "seed='abc' is not accepted (bad value for 'seed')", ["Integer"]),
        (["prompts=countdown", "verifier.timeout_s=-1"], "verifier.timeout_s=-1.0 must be > 0", []),
    ],
)
def test_hydra_and_schema_errors_are_one_line_naming_the_override(argv, start, pieces):
    err = check_train_args(argv + ["results_dir=/tmp/rlc-precheck-never-made"])
    assert err.startswith(start), err
    assert "\n" not in err and "HYDRA_FULL_ERROR" not in err and "search path" not in err
    for piece in pieces:
        assert piece in err, err
    assert not os.path.exists("/tmp/rlc-precheck-never-made")


@pytest.mark.slow
def test_good_command_lines_and_ones_for_hydra_itself_pass(tmp_path):
    res = f"results_dir={tmp_path}/results"
    assert check_train_args([res]) is None
    assert check_train_args(["algorithm=dapo", "trainer.lr=1e-5", res]) is None
    assert check_train_args(["-m", "algorithm=grpo,dapo", "seed=0,1", res]) is None
    assert check_train_args(["--cfg", "job", "trainer.lr=inf"]) is None  # printing the config: Hydra's business
    assert check_train_args(["--help"]) is None
    # resume=<run dir>: train() checks the run's own saved config, not the defaults composed here
    assert check_train_args(["resume=/nonexistent/run", "verifier=countdown"]) is None
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_verifier_in_worker_processes_is_probed_in_the_job_before_the_warm_start(tmp_path):
    """math-verify scores in worker processes (seconds to start): the job's preflight probes it, before the model."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlcompare.cli",
            "train",
            "prompts=countdown",
            "verifier=math_verify",
            "trainer.threads=1",
            "results_dir=results",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 2
    assert (
        "rlcompare: config error: prompts=countdown verifier=math_verify: the verifier cannot score this prompt "
        "set: 8 of 8 surely wrong answers"
    ) in out.stderr
    assert "warm start" not in out.stderr and "Traceback" not in out.stderr
    assert not list((tmp_path / "results").glob("*/*/config.yaml"))  # no run started (Hydra made only its .hydra/)
