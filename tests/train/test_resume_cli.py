"""Resume that says what it does (issue 18): through the real CLI entry, resume=<run dir> works on derived names
(which hold `=`), resume=true with a changed setting is refused naming it, an operational change keeps the run,
and summary.json agrees with metrics.jsonl however SIGTERM lands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conftest import FAST
from rlcompare.train import checkpoint
from rlcompare.cli import conf_dir, main, quote_resume_path
from rlcompare.config import ConfigError
from rlcompare.train.resume import RESUME_IGNORED
from rlcompare.train.run import SIGTERM_EXIT, train
from rlcompare.train.tracking import read_jsonl
from rlcompare.train.trainer import TIMING_PREFIXES  # what varies with the machine, not the run

REPO = Path(__file__).resolve().parents[2]
TIMING = TIMING_PREFIXES


def _rows(run: Path) -> dict:
    return {
        f: [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in read_jsonl(run / f)]
        for f in ("metrics.jsonl", "eval.jsonl", "samples.jsonl")
    }


def _cut_back(run: Path, after: int) -> None:
    """As a kill after step `after` leaves the run: later rows and checkpoints gone, summary 'running'."""
    for f in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        kept = [ln for ln in (run / f).read_text().splitlines(keepends=True) if json.loads(ln)["step"] <= after]
        (run / f).write_text("".join(kept))
    for c in checkpoint.candidates(run):
        if checkpoint.step_of(c) > after:
            shutil.rmtree(c)
    s = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**s, "status": "running"}))


def _only_run(results: Path) -> Path:
    runs = [p for p in (results / "default").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _train(*argv: str) -> int:
    return main(["train", *FAST, *argv])


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_resume_with_a_derived_run_dir_holding_equals_signs_as_typed(tmp_path):
    results = tmp_path / "results"
    assert (
        _train(
            "algorithm.clip.eps_high=0.28", "budget.max_steps=3", "trainer.checkpoint_every=1", f"results_dir={results}"
        )
        == 0
    )
    run = _only_run(results)
    assert "algorithm.clip.eps_high=0.28" in run.name  # a derived name, `=` and all
    want = _rows(run)
    _cut_back(run, 2)
    # the documented form, one argv item as a shell passes `resume=results/default/grpo__...=0.28__s0`
    assert (
        main(
            [
                "train",
                f"resume={run}",
                "trainer.threads=1",
                "trainer.progress=false",
                "logger=none",
                "trainer.unhealthy=warn",
            ]
        )
        == 0
    )
    assert _rows(run) == want
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert _only_run(results) == run  # no stray folder from Hydra


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_resume_true_with_a_changed_setting_under_a_derived_name_is_refused_naming_it(tmp_path, capsys):
    results = tmp_path / "results"
    assert _train("budget.max_steps=2", f"results_dir={results}") == 0
    run = _only_run(results)
    _cut_back(run, 1)
    before = {f: (run / f).read_bytes() for f in ("metrics.jsonl", "summary.json")}
    capsys.readouterr()
    with pytest.raises(SystemExit) as ex:
        _train("budget.max_steps=2", "trainer.lr=1e-05", f"results_dir={results}", "resume=true")
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert f"The run there with the same preset and seed closest to them, {run.name}, differs in: trainer.lr" in err
    assert "trainer.lr: 3e-05 in the run, 1e-05 now" in err
    assert "Only these keys may differ on resume: " + ", ".join(sorted(RESUME_IGNORED)) in err
    assert _only_run(results) == run  # no new run started, and Hydra's empty folder for it removed
    assert {f: (run / f).read_bytes() for f in before} == before


@pytest.mark.slow
def test_resume_true_with_only_an_operational_change_continues_the_same_run(tmp_path, capsys):
    results = tmp_path / "results"
    assert _train("budget.max_steps=3", "trainer.checkpoint_every=1", f"results_dir={results}") == 0
    run = _only_run(results)
    want = _rows(run)
    _cut_back(run, 2)
    capsys.readouterr()
    assert (
        _train(
            "budget.max_steps=3",
            "trainer.checkpoint_every=2",
            "trainer.keep_checkpoints=5",
            f"results_dir={results}",
            "resume=true",
        )
        == 0
    )
    assert "from step 2" in capsys.readouterr().err
    assert _only_run(results) == run and _rows(run) == want


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_an_explicit_run_name_with_a_changed_setting_names_it_and_the_keys_that_may_change(compose):
    s = train(compose("budget.max_steps=2", "run_name=named"))
    _cut_back(Path(s["run_dir"]), 1)
    with pytest.raises(ConfigError) as err:
        train(compose("budget.max_steps=2", "run_name=named", "trainer.group_size=2", "resume=true"))
    msg = str(err.value)
    assert "differs from the run being resumed in: trainer.group_size" in msg and "4 in the run, 2 now" in msg
    assert "Only these keys may differ on resume: " + ", ".join(sorted(RESUME_IGNORED)) in msg


def test_no_key_that_may_change_on_resume_is_part_of_a_derived_run_name():
    exclude = set(OmegaConf.load(Path(conf_dir()) / "config.yaml").hydra.job.config.override_dirname.exclude_keys)
    assert RESUME_IGNORED <= exclude, RESUME_IGNORED - exclude


@pytest.mark.parametrize(
    "path",
    [
        "results/default/grpo__algorithm.clip.eps_high=0.28__s0",
        "results/x/dapo__trainer.betas=[0.9,0.95]__s1",  # `,` and brackets would be a sweep or a list unquoted
        "/tmp/it's here/a\\b\\",  # a quote, backslashes, one at the end
        "/tmp/${oops}/run",  # not an interpolation
    ],
)
def test_a_typed_resume_path_reaches_the_config_unchanged(path):
    override = OverridesParser.create().parse_overrides([quote_resume_path(f"resume={path}")])[0]
    assert override.key_or_group == "resume"
    cfg = OmegaConf.create({"resume": override.value()})
    assert cfg.resume == path


@pytest.mark.parametrize("arg", ["resume=true", "resume=false", "resume=", "seed=1", "resume='a=b'", "+resume=x_1"])
def test_non_paths_and_quoted_values_are_left_alone(arg):
    assert quote_resume_path(arg) == arg


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "offline"}


@pytest.mark.parametrize("after_rows, delay", [(1, 0.0), (2, 0.15)])
@pytest.mark.slow
def test_sigterm_without_checkpoints_leaves_summary_and_metrics_agreeing(tmp_path, after_rows, delay):
    results = tmp_path / "results"
    run = results / "default" / "term"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlcompare.cli",
            "train",
            *FAST,
            "algorithm=dapo",
            "budget.max_steps=50",
            "trainer.checkpoint_every=0",
            "run_name=term",
            f"results_dir={results}",
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "log", "w"),
    )
    t0 = time.time()
    while len(read_jsonl(run / "metrics.jsonl")) < after_rows:
        assert proc.poll() is None and time.time() - t0 < 240, (tmp_path / "log").read_text()[-2000:]
        time.sleep(0.005)
    time.sleep(delay)  # mostly lands inside the next step, where the step counter has already moved
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == SIGTERM_EXIT
    rows = read_jsonl(run / "metrics.jsonl")
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"] == "terminated (SIGTERM)"
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert s["steps"] == len(rows) and s["tokens/generated"] == rows[-1]["tokens/generated"]
