"""Checkpoints never execute code (issue 18): safetensors + JSON, a pickle is refused, a crafted file runs nothing,
and a resume whose checkpoints are all unusable is refused instead of restarting from step 0."""

from __future__ import annotations

import json
import math
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from rlcompare.train import checkpoint
from rlcompare.config import ConfigError
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl
from rlcompare.train.trainer import TIMING_PREFIXES  # what varies with the machine, not the run

REPO = Path(__file__).resolve().parents[2]
OV = [
    "algorithm=dapo",
    "budget.max_steps=4",
    "trainer.checkpoint_every=1",
    "trainer.keep_checkpoints=4",
    "trainer.eval_every=2",
    "trainer.warmup_steps=10",
]


class _TouchOnLoad:
    """Unpickling this creates the file: what a hostile checkpoint would do (any code could run instead)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _hostile_pickle(marker: Path) -> bytes:
    return pickle.dumps({"version": 2, "policy": _TouchOnLoad(marker)})


def _interrupted_run(compose, name: str, after: int) -> Path:
    """A completed run cut back to how a kill after step `after` leaves it: later rows and checkpoints gone."""
    s = train(compose(*OV, f"run_name={name}"))
    run = Path(s["run_dir"])
    for f in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        rows = [ln for ln in (run / f).read_text().splitlines(keepends=True) if json.loads(ln)["step"] <= after]
        (run / f).write_text("".join(rows))
    for c in checkpoint.candidates(run):
        if checkpoint.step_of(c) > after:
            import shutil

            shutil.rmtree(c)
    (run / "summary.json").write_text(
        json.dumps({**json.loads((run / "summary.json").read_text()), "status": "running"})
    )
    return run


def _replace_with_pickle(step_dir: Path, payload: bytes) -> None:
    for f in step_dir.iterdir():
        f.unlink()
    (step_dir / "state.pt").write_bytes(payload)


def _snapshot(run: Path) -> dict:
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and ".writer.lock" not in p.name
    }


def test_the_hostile_pickle_used_below_really_runs_code_when_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "p.pkl").write_bytes(_hostile_pickle(marker))
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())",
            str(tmp_path / "p.pkl"),
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
    )
    assert marker.exists()  # so the tests below would catch a loader that unpickles


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(compose, tmp_path):
    run = _interrupted_run(compose, "hostile", after=2)
    marker = tmp_path / "pwned"
    for c in checkpoint.candidates(run):  # every checkpoint of the run is the crafted one
        _replace_with_pickle(c, _hostile_pickle(marker))
    before = _snapshot(run)
    with pytest.raises(ConfigError) as err:
        train(compose(*OV, "run_name=hostile", "resume=true"))
    assert not marker.exists()
    msg = str(err.value)
    assert "none of the checkpoints" in msg and "step_00000002: it is a pickled state.pt" in msg
    assert "can execute code" in msg and "without resume=true" in msg  # and how to start over
    assert _snapshot(run) == before  # refused before anything was written or deleted


@pytest.mark.slow
def test_a_pickled_newest_checkpoint_is_skipped_for_the_good_one_before_it(compose, tmp_path, capsys):
    ref = train(compose(*OV, "run_name=ref"))
    want = read_jsonl(Path(ref["run_dir"]) / "metrics.jsonl")
    run = _interrupted_run(compose, "fallback", after=3)
    marker = tmp_path / "pwned"
    _replace_with_pickle(run / "checkpoints" / "step_00000003", _hostile_pickle(marker))
    s = train(compose(*OV, "run_name=fallback", "resume=true"))
    assert not marker.exists()
    err = capsys.readouterr().err
    assert "step_00000003 could not be used (it is a pickled state.pt" in err and "from step 2" in err
    assert s["status"] == "completed"
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]  # noqa: E731
    assert strip(read_jsonl(run / "metrics.jsonl")) == strip(want)  # continued from step 2 exactly


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_damaged_checkpoints_everywhere_refuse_the_resume_instead_of_restarting(compose):
    run = _interrupted_run(compose, "alldamaged", after=3)
    for c in checkpoint.candidates(run):
        for f in c.iterdir():
            f.write_bytes(f.read_bytes()[:100])  # torn mid-write
    rows = read_jsonl(run / "metrics.jsonl")
    with pytest.raises(ConfigError, match=r"none of the checkpoints .* can be resumed from"):
        train(compose(*OV, "run_name=alldamaged", "resume=true"))
    assert read_jsonl(run / "metrics.jsonl") == rows and len(checkpoint.candidates(run)) == 3  # nothing lost


def _write(tmp_path: Path, tensors: dict, tree) -> Path:
    d = tmp_path / "checkpoints" / "step_00000001"
    d.mkdir(parents=True)
    save_file(
        tensors,
        str(d / checkpoint.FILE),
        metadata={"format": checkpoint.FORMAT, "version": str(checkpoint.FORMAT_VERSION), "tree": json.dumps(tree)},
    )
    return d


@pytest.mark.parametrize(
    "tree, why",
    [
        (
            {"version": checkpoint.FORMAT_VERSION, "step": 1, "x": {"__reduce__": ["os.system", ["touch pwned"]]}},
            "unknown entry",
        ),
        ({"version": checkpoint.FORMAT_VERSION, "step": 1, "x": {"__tensor__": "not/in/file"}}, "does not hold"),
        (
            {"version": checkpoint.FORMAT_VERSION, "step": 1, "x": {"__ndarray__": "t", "dtype": "object"}},
            "unknown entry",
        ),
        ({"version": checkpoint.FORMAT_VERSION, "step": 7}, "records step 7, not the step in its name"),
        ({"version": 2, "step": 1}, "not a checkpoint of this format"),
    ],
)
def test_crafted_json_in_a_checkpoint_is_refused(tmp_path, tree, why):
    d = _write(tmp_path, {"t": torch.zeros(2)}, tree)
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(why)):
        checkpoint.read(d)
    assert not (tmp_path / "pwned").exists()


def _rewrite(step_dir: Path, change) -> None:
    f = step_dir / checkpoint.FILE
    blob = checkpoint.read_file(f)
    change(blob)
    checkpoint.write_file(blob, f)


@pytest.mark.parametrize(
    "change, what",
    [
        (lambda b: b.update(stream_position="0; rm -rf /"), "data position"),
        (lambda b: b["rng"].update(torch=[1, 2, 3]), "RNG state"),
        (lambda b: b["opt"].update(state=[]), "optimizer state"),
        (lambda b: b["state"].update(step=99), "trainer state"),
        (lambda b: b["policy"].update(extra="text"), "policy weights"),
    ],
)
@pytest.mark.slow
def test_a_well_formed_file_with_contents_of_the_wrong_kind_is_refused_before_the_model_loads(compose, change, what):
    run = _interrupted_run(compose, "wrongkind", after=2)
    for c in checkpoint.candidates(run):
        _rewrite(c, change)
    with pytest.raises(checkpoint.CheckpointError, match=f"its {what} is malformed"):
        checkpoint.read(checkpoint.latest(run))
    with pytest.raises(ConfigError, match="none of the checkpoints"):
        train(compose(*OV, "run_name=wrongkind", "resume=true"))


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_checkpoint_that_does_not_fit_the_model_fails_cleanly_and_keeps_the_run(compose):
    run = _interrupted_run(compose, "misfit", after=2)
    name = next(iter(checkpoint.read_file(checkpoint.latest(run) / checkpoint.FILE)["policy"]))
    _rewrite(checkpoint.latest(run), lambda b: b["policy"].update({name: torch.zeros(3, 3)}))
    rows = read_jsonl(run / "metrics.jsonl")
    with pytest.raises(
        ConfigError, match=r"checkpoint .*step_00000002 does not fit this run \(CheckpointError: its policy weight"
    ):
        train(compose(*OV, "run_name=misfit", "resume=true"))
    assert read_jsonl(run / "metrics.jsonl") == rows and len(checkpoint.candidates(run)) == 2


def test_a_file_that_is_not_safetensors_is_unreadable_not_fatal(tmp_path):
    d = tmp_path / "checkpoints" / "step_00000001"
    d.mkdir(parents=True)
    (d / checkpoint.FILE).write_bytes(b"\xff" * 8 + b"{not json")
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.read(d)
    with pytest.raises(checkpoint.NoUsableCheckpoint, match="step_00000001"):
        checkpoint.read_latest(tmp_path)
    assert checkpoint.read_latest(tmp_path / "elsewhere") is None  # no checkpoints at all: nothing to refuse


def test_plain_data_and_tensors_round_trip_exactly(tmp_path):
    w = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    blob = {
        "version": checkpoint.FORMAT_VERSION,
        "step": 1,
        "tied": {"embed": w, "head": w},  # one tensor under two names (tied weights)
        "view": w[:, 1],  # a non-contiguous view of it
        "opt": {0: {"step": torch.tensor(3.0), "exp_avg": torch.tensor([0.25, -0.125])}},  # integer keys
        "betas": (0.9, 0.99),
        "floats": [float("nan"), float("inf"), -float("inf"), 1e-300],
        "numpy": ("MT19937", np.array([0, 1, 4294967295], dtype=np.uint32), 623, 0, 0.0),
        "bf16": torch.tensor([1.5, -0.75], dtype=torch.bfloat16),
        "none": None,
        "flag": True,
        "name": "x",
    }
    d = tmp_path / "checkpoints" / "step_00000001"
    d.mkdir(parents=True)
    checkpoint.write_file(blob, d / checkpoint.FILE)
    got = checkpoint.read_file(d / checkpoint.FILE)
    assert torch.equal(got["tied"]["embed"], w) and torch.equal(got["tied"]["head"], w)
    assert torch.equal(got["view"], torch.tensor([-2.0, 3.0]))
    assert set(got["opt"]) == {0} and float(got["opt"][0]["step"]) == 3.0
    assert got["opt"][0]["exp_avg"].tolist() == [0.25, -0.125]
    assert got["betas"] == (0.9, 0.99) and isinstance(got["betas"], tuple)
    assert math.isnan(got["floats"][0]) and got["floats"][1:] == [float("inf"), -float("inf"), 1e-300]
    assert got["numpy"][0] == "MT19937" and got["numpy"][2:] == (623, 0, 0.0)
    assert got["numpy"][1].dtype == np.uint32 and got["numpy"][1].tolist() == [0, 1, 4294967295]
    assert got["bf16"].dtype == torch.bfloat16 and got["bf16"].tolist() == [1.5, -0.75]
    assert got["none"] is None and got["flag"] is True and got["name"] == "x"


def test_saving_something_that_would_need_pickle_fails_instead(tmp_path):
    with pytest.raises(TypeError, match=r"cannot store a _TouchOnLoad at /x"):
        checkpoint.write_file({"x": _TouchOnLoad(tmp_path / "m")}, tmp_path / "f.safetensors")


def test_no_module_loads_with_torch_load():
    """torch.load unpickles (weights_only=False runs code; True still parses a pickle): no module may use it."""
    offenders = [p.name for p in (REPO / "rlcompare").glob("*.py") if re.search(r"\btorch\.load\(", p.read_text())]
    assert offenders == []
