"""Every member x seed of a sweep as one job of a Hydra launcher: the job list sweeper, failure isolation under
parallel launchers (joblib, submitit's local executor, Ray when installed), equal rows serial and parallel, the
threads/device rule (rlcompare.train.placement) and W&B grouping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from rlcompare.train import placement as pl
from rlcompare.sweep import launch as sw_launch
from rlcompare.sweep import (
    Job,
    SweepError,
    check_launch_settings,
    job_batch,
    load_sweep,
    read_jobs_file,
    resolve_members,
    run_jobs,
    run_sweep,
)
from rlcompare.train.trainer import TIMING_PREFIXES

# seconds-long runs (a 20-step warm start, 2 RL steps of 4 prompts x 4 completions); no trainer.threads: the rule sets it
QUICK = [
    "budget=tiny",
    "budget.max_steps=2",
    "logger=none",
    "trainer.progress=false",
    "model.warm_start.steps=20",
    "prompts.n_eval=16",
    "trainer.prompts_per_step=4",
    "trainer.group_size=4",
    "trainer.eval_every=2",
    "trainer.unhealthy=warn",  # the 20-step warm start solves nothing: no learning signal (docs/metrics.md)
]

# two members that complete and one that fails at its first step (a non-finite loss, trainer.max_bad_steps=1)
SWEEP = """
    name: par
    seeds: [0]
    base: {label: grpo, overrides: [algorithm=grpo]}
    variants:
      - {label: clip_higher, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
      - {label: boom, component: [trainer.inject_nan_at_step, trainer.max_bad_steps],
         overrides: [trainer.inject_nan_at_step=1, trainer.max_bad_steps=1]}
"""


def write_sweep(tmp_path: Path, completing_only: bool = False) -> Path:
    p = tmp_path / ("par-ok.yaml" if completing_only else "par.yaml")
    text = textwrap.dedent(SWEEP)
    p.write_text(text[: text.index("  - {label: boom")] if completing_only else text)
    return p


def rows(path: Path) -> list[dict]:
    """metrics.jsonl rows without their timing columns."""
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)})
    return out


def started_and_ended(d: Path) -> tuple[float, float]:
    """When Hydra started the job (its .hydra/ files) and when the run wrote its final summary."""
    return (d / ".hydra" / "overrides.yaml").stat().st_mtime, (d / "summary.json").stat().st_mtime


def check_isolated_and_reported(root: Path, out: str, tmp_path: Path) -> None:
    from rlcompare.report import build_report

    assert "2 of 3 runs completed" in out and "boom (seed 0): FloatingPointError" in out
    status = {
        d.name: json.loads((d / "summary.json").read_text())["status"]
        for d in root.iterdir()
        if d.is_dir() and (d / "summary.json").exists()
    }
    assert status == {"grpo__s0": "completed", "clip_higher__s0": "completed", "boom__s0": "failed"}
    rec = yaml.safe_load((root / "sweep.yaml").read_text())
    assert rec["runs"]["boom"]["0"]["status"] == "failed" and rec["runs"]["grpo"]["0"]["status"] == "completed"
    res = build_report(root, out_dir=tmp_path / f"report-{root.parent.name}", reps=50)
    runs = res["runs"].set_index("run")
    assert runs.loc["boom__s0", "status"] == "failed" and not runs.loc["boom__s0", "included"]
    assert any("failed run" in f and "boom__s0" in f for f in res["flags"])
    diff = res["differences"]
    assert set(diff["variant"]) == {"clip_higher"} and set(diff["reference"]) == {"grpo"}
    assert Path(res["report_path"]).exists()


# ----------------------------------------------------------------------------- sweeps under launchers
@pytest.mark.slow  # over 30 s on a busy 2-core machine (process starts, imports)
def test_joblib_sweep_runs_two_at_once_isolates_a_failure_and_matches_the_serial_rows(tmp_path, capfd):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    p = write_sweep(tmp_path)
    fixed = QUICK + ["trainer.threads=1"]  # the same threads serial and parallel: the rows must then be equal
    # serially (Hydra's basic launcher), the members that complete
    assert run_sweep(write_sweep(tmp_path, completing_only=True), fixed + [f"results_dir={tmp_path / 'serial'}"]) == 0
    assert "2 of 2 runs completed" in capfd.readouterr().out
    assert (
        run_sweep(p, fixed + [f"results_dir={tmp_path / 'par2'}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
        == 1
    )
    out, err = capfd.readouterr()
    assert "launching 3 job(s)" in err and "Joblib.Parallel(n_jobs=2" in out + err  # Hydra logs to stdout
    serial, par = tmp_path / "serial" / "par", tmp_path / "par2" / "par"
    check_isolated_and_reported(par, out, tmp_path)
    for run in ("grpo__s0", "clip_higher__s0"):
        a, b = rows(serial / run / "metrics.jsonl"), rows(par / run / "metrics.jsonl")
        assert a == b, run
    assert len(rows(par / "grpo__s0" / "metrics.jsonl")) == 2
    # the two workers ran the first two jobs at the same time
    (s0, e0), (s1, e1) = started_and_ended(par / "grpo__s0"), started_and_ended(par / "clip_higher__s0")
    assert s0 < e1 and s1 < e0


@pytest.mark.slow  # over 30 s on a busy 2-core machine (process starts, imports)
def test_submitit_local_sweep_isolates_a_failure_splits_the_cores_and_groups_wandb_runs(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    p = write_sweep(tmp_path)
    extra = [o for o in QUICK if not o.startswith("logger")] + [
        "logger=wandb",
        "logger.mode=offline",
        f"results_dir={tmp_path / 'sub'}",
        "hydra/launcher=submitit_local",
    ]
    assert run_sweep(p, extra) == 1
    out = capsys.readouterr().out
    root = tmp_path / "sub" / "par"
    check_isolated_and_reported(root, out, tmp_path)
    # submitit's local executor starts the 3 jobs at once: each gets cores // 3 threads (at least 1)
    threads = yaml.safe_load((root / "grpo__s0" / "config.yaml").read_text())["trainer"]["threads"]
    assert threads == max(1, pl.cpu_cores() // 3)
    # what W&B recorded, read back from the offline run's log
    for run, job_type, tags in (
        ("grpo__s0", "grpo", ["base"]),
        ("clip_higher__s0", "clip_higher", ["algorithm.clip"]),
        ("boom__s0", "boom", ["trainer.inject_nan_at_step", "trainer.max_bad_steps"]),
    ):
        rec = wandb_run_record(root / run)
        assert (rec["run_group"], rec["job_type"], rec["tags"]) == ("par", job_type, tags)


def wandb_run_record(run_dir: Path) -> dict:
    """The `run` record of a run's offline W&B log, through W&B's own reader (`wandb leet inspect --json`)."""
    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    wandb_cli = Path(sys.executable).with_name("wandb")
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(log)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    for line in out.splitlines():
        rec = json.loads(line)
        if rec.get("type") == "run":
            return rec["run"]
    raise AssertionError(f"no run record in {log}")


@pytest.mark.slow  # over 30 s on a busy 2-core machine (process starts, imports)
def test_ray_sweep_isolates_a_failure(tmp_path, capsys):
    """Runs where hydra-ray-launcher is installed (pip install -e ".[ray]"; docs/scaling.md)."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    p = write_sweep(tmp_path)
    extra = QUICK + [f"results_dir={tmp_path / 'ray'}", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2"]
    assert run_sweep(p, extra) == 1
    check_isolated_and_reported(tmp_path / "ray" / "par", capsys.readouterr().out, tmp_path)


@pytest.mark.slow  # over 30 s on a busy 2-core machine (process starts, imports)
def test_train_multirun_under_joblib_splits_the_cores(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    env = {**os.environ, "WANDB_MODE": "offline"}
    env.pop(pl.LAUNCH_JOBS_ENV, None)
    quick = [o for o in QUICK if not o.startswith("budget.max_steps")] + ["budget.max_steps=1"]
    cmd = [
        sys.executable,
        "-m",
        "rlcompare.cli",
        "train",
        "-m",
        *quick,
        "seed=0,1",
        f"results_dir={tmp_path}",
        "experiment=m",
        "run_name=r__s${seed}",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=-1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    # n_jobs=-1 means a worker per core, but the command line makes 2 jobs: 2 run at once, cores // 2 threads each
    for seed in (0, 1):
        cfg = yaml.safe_load((tmp_path / "m" / f"r__s{seed}" / "config.yaml").read_text())
        assert cfg["trainer"]["threads"] == max(1, pl.cpu_cores() // 2)


@pytest.mark.slow
def test_the_console_script_runs_a_sweep_from_outside_the_checkout(tmp_path):
    """`rlcompare sweep` as users type it: the installed console script, from a folder that is not the checkout,
    with no PYTHONPATH. Hydra lists plugins from the `hydra_plugins` folders on sys.path, and an editable install
    puts none of rlcompare's there, so the sweeper must be registered by rlcompare itself (it once was not: the
    sweep stopped at "Hydra cannot find rlcompare's sweeper" unless run with `python -m` from the checkout)."""
    repo = Path(__file__).resolve().parents[2]
    script = Path(sys.executable).with_name("rlcompare")
    assert script.exists(), f"no console script beside {sys.executable}: install with pip install -e ."
    env = {**os.environ, "WANDB_MODE": "offline"}
    env.pop(pl.LAUNCH_JOBS_ENV, None)
    env.pop("PYTHONPATH", None)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    spec = write_sweep(tmp_path, completing_only=True)
    quick = [o for o in QUICK if not o.startswith("budget.max_steps")] + ["budget.max_steps=1"]
    res = subprocess.run(
        [str(script), "sweep", str(spec), *quick, f"results_dir={tmp_path / 'out'}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "2 of 2 runs completed" in res.stdout
    for run in ("grpo__s0", "clip_higher__s0"):
        summary = json.loads((tmp_path / "out" / "par" / run / "summary.json").read_text())
        assert summary["status"] == "completed"
    assert not (repo / "par").exists() and not (workdir / "results").exists()


# ----------------------------------------------------------------------------- failure isolation (fake launches)
def _members(tmp_path: Path):
    p = write_sweep(tmp_path)
    return load_sweep(p), resolve_members(load_sweep(p), [f"results_dir={tmp_path / 'results'}"])


def _start(root: Path, j, status=None, error=None):
    d = root / f"{j.member.name}__s{j.seed}"
    (d / ".hydra").mkdir(parents=True, exist_ok=True)
    (d / ".hydra" / "overrides.yaml").write_text("[]\n")
    if status:  # a run writes its config before its first summary
        (d / "config.yaml").write_text(yaml.safe_dump({**j.member.config, "seed": j.seed}))
        (d / "summary.json").write_text(json.dumps({"status": status, "error": error}))


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_jobs_stopped_together_are_relaunched_alone_to_find_the_cause(tmp_path):
    """A crash under a parallel launcher takes down the job running beside it: both died, so each is relaunched
    alone (resume=true); the bystander completes, the cause dies again and is failed; jobs never started are
    relaunched together."""
    spec, members = _members(tmp_path)
    root = tmp_path / "results" / "par"
    grpo, clip, boom = members
    jobs = [Job(grpo, 0), Job(clip, 0), Job(boom, 0), Job(grpo, 1)]
    calls = []

    def fake_launch(batch):
        calls.append([(j.member.name, j.seed, j.resume) for j in batch])
        names = {j.key for j in batch}
        if ("boom", 0) in names:  # boom crashes; whatever started beside it is killed mid-run
            for j in batch:
                if j.key in (("boom", 0), ("clip_higher", 0)):
                    _start(root, j, status="running")
            for j in batch:
                if j.key == ("grpo", 0):
                    _start(root, j, status="completed")
            return 1
        for j in batch:
            _start(root, j, status="completed")
        return 0

    res = run_jobs(jobs, root, fake_launch)
    assert calls == [
        [("grpo", 0, False), ("clip_higher", 0, False), ("boom", 0, False), ("grpo", 1, False)],
        [("clip_higher", 0, True)],
        [("boom", 0, True)],
        [("grpo", 1, False)],
    ]
    assert {k: r["status"] for k, r in res.items()} == {
        ("grpo", 0): "completed",
        ("clip_higher", 0): "completed",
        ("boom", 0): "failed",
        ("grpo", 1): "completed",
    }
    assert "died mid-run (exit code 1)" in res[("boom", 0)]["error"]


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_launch_that_starts_nothing_fails_its_jobs_once(tmp_path):
    spec, members = _members(tmp_path)
    root = tmp_path / "results" / "par"
    calls = []

    def fake_launch(batch):
        calls.append(len(batch))
        return 1

    res = run_jobs([Job(m, 0) for m in members], root, fake_launch)
    assert calls == [3]
    assert all(r["status"] == "failed" and "before this job started (exit code 1)" in r["error"] for r in res.values())


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_launch_that_ends_well_without_a_summary_fails_that_job(tmp_path):
    spec, members = _members(tmp_path)
    root = tmp_path / "results" / "par"

    def fake_launch(batch):
        _start(root, batch[0], status="completed")
        return 0

    res = run_jobs([Job(m, 0) for m in members], root, fake_launch)
    assert res[("grpo", 0)]["status"] == "completed"
    assert res[("boom", 0)]["error"] == "the multirun ended (exit code 0) without this run's summary.json"


# ----------------------------------------------------------------------------- the job list sweeper
def test_job_batch_puts_each_jobs_own_overrides_after_the_command_line():
    batch = job_batch(
        ["results_dir=/r", "experiment=x", "trainer.lr=1e-4"],
        [["algorithm=dapo", "trainer.lr=3e-4", "seed=0"], ["algorithm=grpo", "seed=1"]],
    )
    assert batch == [
        ["results_dir=/r", "experiment=x", "algorithm=dapo", "trainer.lr=3e-4", "seed=0"],
        ["results_dir=/r", "experiment=x", "trainer.lr=1e-4", "algorithm=grpo", "seed=1"],
    ]
    from hydra.errors import HydraException

    with pytest.raises(HydraException, match="list each value as its own job"):
        job_batch(["seed=0,1"], [["algorithm=grpo"]])


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "hydra.sweeper.jobs_file is not set"),
        ("jobs: algorithm=grpo\n", "expected `jobs:`"),
        ("jobs: [[seed=0], [1]]\n", "expected `jobs:`"),
        ("jobs: []\n", "expected `jobs:`"),
        ("jobs: [unclosed\n", "cannot be read"),
    ],
)
def test_a_bad_jobs_file_is_refused_naming_the_setting(tmp_path, text, message):
    from hydra.errors import HydraException

    path = None
    if text is not None:
        path = tmp_path / "jobs.yaml"
        path.write_text(text)
    with pytest.raises(HydraException, match=message):
        read_jobs_file(str(path) if path else None)


@pytest.mark.slow
def test_launch_settings_are_checked_before_anything_runs(tmp_path):
    p = write_sweep(tmp_path)
    results = tmp_path / "results"
    with pytest.raises(SweepError, match=r"(?s)hydra/launcher/nope.*pip install -e \"\.\[launchers\]\""):
        run_sweep(p, QUICK + [f"results_dir={results}", "hydra/launcher=nope"])
    with pytest.raises(SweepError, match="its own sweeper"):
        run_sweep(p, QUICK + [f"results_dir={results}", "hydra/sweeper=basic"])
    assert not results.exists()  # refused before the results folder was made
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    assert check_launch_settings(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]) == "JoblibLauncher"
    with pytest.raises(SweepError, match="hydra.launcher.n_job"):
        check_launch_settings(["hydra/launcher=joblib", "hydra.launcher.n_job=2"])


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_dry_run_names_the_launcher(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    p = write_sweep(tmp_path)
    assert run_sweep(p, [f"results_dir={tmp_path}", "hydra/launcher=joblib"], dry_run=True) == 0
    out = capsys.readouterr().out
    assert "the 3 runs are the jobs of one Hydra multirun (JoblibLauncher)" in out


# ----------------------------------------------------------------------------- the threads and device rule
@pytest.mark.parametrize("n_jobs, cores, workers", [(None, 8, 1), (3, 8, 3), (-1, 16, 16), (-2, 16, 15), (-20, 4, 1)])
def test_joblib_workers_follow_joblibs_rule(n_jobs, cores, workers):
    assert pl.joblib_workers(n_jobs, cores) == workers


JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


@pytest.mark.parametrize(
    "launcher, launched, cores, concurrent",
    [
        ({"_target_": JOBLIB, "n_jobs": 2}, 8, 2, 2),
        ({"_target_": JOBLIB, "n_jobs": -1}, 3, 16, 3),  # a worker per core, but only 3 jobs
        ({"_target_": JOBLIB, "n_jobs": -1}, None, 16, 16),
        ({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"}, 5, 2, 5),
        ({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"}, 64, 2, 1),
        ({"_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"}, 8, 16, 1),
        ({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}, 8, 16, 1),
    ],
)
def test_concurrent_jobs_per_launcher(launcher, launched, cores, concurrent):
    assert pl.concurrent_jobs(launcher, launched, cores) == concurrent


@pytest.mark.parametrize(
    "explicit, cores, concurrent, allocated, threads",
    [
        (None, 16, 3, None, 5),
        (None, 2, 2, None, 1),
        (None, 2, 8, None, 1),
        (4, 16, 3, None, 4),
        (None, 16, 3, 6, 6),
        (None, 16, 1, None, None),
    ],
)
def test_job_threads(explicit, cores, concurrent, allocated, threads):
    assert pl.job_threads(explicit, cores, concurrent, allocated) == threads


def test_submitit_cpus_per_task_is_the_jobs_allocation():
    slurm = {"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", "cpus_per_task": 6}
    assert pl.job_cpus(slurm) == 6 and pl.job_cpus({**slurm, "cpus_per_task": None}) is None
    assert pl.job_cpus({"_target_": JOBLIB, "cpus_per_task": 6}) is None


def test_device_order_starts_at_job_number_mod_devices():
    assert pl.device_order(5, 4) == [1, 2, 3, 0]
    assert pl.device_order(0, 1) == [0]
    taken = {1, 2}
    assert pl.choose_device(5, 4, lambda k: k not in taken) == (3, True)
    assert pl.choose_device(5, 4, lambda k: False) == (1, False)  # every device claimed: shared, job mod devices


def test_each_process_claims_a_free_device_through_a_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCOMPARE_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    monkeypatch.setattr(pl, "_claimed", {})
    other = pl.try_lock(tmp_path / "cuda-4.lock")  # another worker holds physical GPU 4 (visible index 0)
    assert other is not None
    assert pl.claim_cuda_device(job_num=2, n_devices=2) == (1, True)
    assert pl.try_lock(tmp_path / "cuda-7.lock") is None  # now held by this process
    assert pl.claim_cuda_device(job_num=0, n_devices=2) == (1, True)  # a later job of this worker keeps its device
    monkeypatch.setattr(pl, "_claimed", {})
    assert pl.claim_cuda_device(job_num=3, n_devices=2) == (1, False)  # both held: job 3 mod 2, shared
    other.close()


def test_train_multirun_counts_its_jobs(monkeypatch):
    monkeypatch.delenv(pl.LAUNCH_JOBS_ENV, raising=False)
    pl.note_multirun_jobs(["-m", "algorithm=grpo,dapo", "seed=0,1,2", "hydra/launcher=joblib", "trainer.lr=1e-4"])
    assert os.environ[pl.LAUNCH_JOBS_ENV] == "6"
    monkeypatch.delenv(pl.LAUNCH_JOBS_ENV)
    pl.note_multirun_jobs(["algorithm=grpo,dapo"])  # not a multirun
    assert pl.LAUNCH_JOBS_ENV not in os.environ


# ----------------------------------------------------------------------------- W&B grouping
def test_wandb_grouping_aggregates_seeds_per_variant():
    sweep_cfg = {
        "experiment": "one_knob",
        "sweep": {
            "name": "one_knob",
            "variant": "seq_ratio",
            "reference": "grpo",
            "component": "algorithm.ratio,algorithm.clip",
        },
    }
    assert pl.wandb_grouping(None, sweep_cfg, "seq_ratio__s2") == {
        "group": "one_knob",
        "job_type": "seq_ratio",
        "tags": ["algorithm.ratio", "algorithm.clip"],
    }
    base = {"experiment": "one_knob", "sweep": {"name": "one_knob", "variant": "grpo", "component": None}}
    assert pl.wandb_grouping("mine", base, "grpo__s0") == {"group": "mine", "job_type": "grpo", "tags": ["base"]}
    plain = {"experiment": "default", "sweep": {"name": None, "variant": None, "component": None}}
    assert pl.wandb_grouping(None, plain, "dapo__trainer.lr=1e-05__s12-2") == {
        "group": "default",
        "job_type": "dapo__trainer.lr=1e-05",
        "tags": [],
    }
    long = pl.wandb_grouping(None, plain, "x" * 80 + "__s0")["job_type"]
    assert len(long) == 64 and long.startswith("x" * 55 + "~")


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_resume_launches_the_unfinished_runs_as_one_batch(tmp_path, monkeypatch, capsys):
    """--resume keeps completed runs, continues the failed one (resume=true) and starts the missing one, all in
    one launch."""
    p = write_sweep(tmp_path)
    root = tmp_path / "results" / "par"
    for run, status in (("grpo__s0", "completed"), ("boom__s0", "failed")):
        (root / run).mkdir(parents=True)
        (root / run / "summary.json").write_text(json.dumps({"status": status, "error": None}))
    launches = []

    def fake_launch_jobs(spec, root_, jobs, hydra_extra):
        launches.append([(j.member.name, j.seed, j.resume) for j in jobs])
        assert "resume=true" in jobs[1].overrides(spec) and "resume=true" not in jobs[0].overrides(spec)
        for j in jobs:
            _start(root_, j, status="completed")
        return 0

    monkeypatch.setattr(sw_launch, "launch_jobs", fake_launch_jobs)
    assert run_sweep(p, [f"results_dir={tmp_path / 'results'}"], resume=True) == 0
    assert launches == [[("clip_higher", 0, False), ("boom", 0, True)]]
    runs = yaml.safe_load((root / "sweep.yaml").read_text())["runs"]
    assert runs["grpo"]["0"]["note"] == "kept from an earlier launch"
    assert runs["boom"]["0"]["status"] == runs["clip_higher"]["0"]["status"] == "completed"
