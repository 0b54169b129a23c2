"""`rlcompare sweep`: the one-change check, ladders, shipped sweep files, end-to-end runs and failure isolation."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from rlcompare.config.components import COMPONENTS
from rlcompare.config.flat import flatten
from rlcompare.sweep import Job, SweepError, check_one_change, load_sweep, main, resolve_members, run_jobs, run_sweep

REPO = Path(__file__).resolve().parents[2]
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))

# seconds-long runs (a 20-step warm start, 3 RL steps of 4 prompts x 4 completions)
FAST = [
    "budget=tiny",
    "logger=none",
    "trainer.progress=false",
    "model.warm_start.steps=20",
    "prompts.n_eval=20",
    "trainer.prompts_per_step=4",
    "trainer.group_size=4",
    "trainer.eval_every=2",
    "trainer.threads=1",
    "trainer.unhealthy=warn",  # the 20-step warm start solves nothing: no learning signal (docs/metrics.md)
]  # one torch thread: 2 threads oversubscribe a busy 2-core machine badly


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def members_of(path: Path, tmp_path: Path, extra=()):
    return resolve_members(load_sweep(path), [f"results_dir={tmp_path / 'results'}", *extra])


# ----------------------------------------------------------------------------- the one-change check
@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_variant_touching_two_components_is_refused_naming_the_stray_key(tmp_path, capsys):
    p = write(
        tmp_path,
        """
        name: two_things
        seeds: [0]
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: clip_higher, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
          - {label: sneaky, component: clipping, overrides: [algorithm.clip.eps_high=0.28, trainer.lr=3e-4]}
    """,
    )
    members = members_of(p, tmp_path)
    with pytest.raises(SweepError) as e:
        check_one_change(members)
    msg = str(e.value)
    assert "'sneaky'" in msg and "clipping" in msg and "trainer.lr" in msg
    assert "3e-05" in msg and "0.0003" in msg  # both values
    assert "'clip_higher'" not in msg  # the clean variant is not blamed
    assert "algorithm.clip.eps_high" not in msg.split("also changes")[1]  # the declared change is not stray

    # the CLI refuses with exit code 2 before training anything
    rc = main([str(p), f"results_dir={tmp_path / 'results'}"])
    assert rc == 2
    assert "sneaky" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_explicit_component_list_is_allowed_but_still_checked(tmp_path):
    p = write(
        tmp_path,
        """
        name: two_declared
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: both, component: [clipping, lr], overrides: [algorithm.clip.eps_high=0.28, trainer.lr=3e-4]}
          - {label: three, component: [clipping, lr], overrides: [algorithm.clip.eps_high=0.28, trainer.lr=3e-4, algorithm.kl.coef=0.0]}
    """,
    )
    with pytest.raises(SweepError) as e:
        check_one_change(members_of(p, tmp_path))
    msg = str(e.value)
    assert "'three'" in msg and "algorithm.kl.coef" in msg and "'both'" not in msg

    q = write(
        tmp_path,
        """
        name: comma
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: both, component: "clipping, lr", overrides: [trainer.lr=3e-4]}
    """,
        "comma.yaml",
    )
    with pytest.raises(SweepError, match="explicitly as a list"):
        load_sweep(q)


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_ratio_component_covers_its_clip_range_and_config_paths_are_components(tmp_path):
    p = write(
        tmp_path,
        """
        name: ratio
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: seq, component: ratio, overrides: [algorithm.ratio=sequence, algorithm.clip.eps_low=3e-4, algorithm.clip.eps_high=4e-4]}
          - {label: pps, component: trainer.prompts_per_step, overrides: [trainer.prompts_per_step=8]}
    """,
    )
    members = members_of(p, tmp_path)
    check_one_change(members)
    seq = members[1]
    assert {k for k, _, _ in seq.diff} == {"algorithm.ratio", "algorithm.clip.eps_low", "algorithm.clip.eps_high"}
    assert seq.config["algorithm"]["ratio"] == "sequence" and members[0].config["algorithm"]["ratio"] == "token"


def test_a_shared_interpolation_follows_its_target(tmp_path):
    """Dr. GRPO's horizon is ${budget.max_new_tokens}: a budget variant changes it without a second component."""
    p = write(
        tmp_path,
        """
        name: interp
        base: {label: drgrpo, overrides: [algorithm=drgrpo]}
        variants:
          - {label: short, component: budget, overrides: [budget.max_new_tokens=6]}
          - {label: fixed_h, component: budget, overrides: [budget.max_new_tokens=6, algorithm.horizon=10]}
    """,
    )
    members = members_of(p, tmp_path)
    assert members[1].config["algorithm"]["horizon"] == 6
    with pytest.raises(SweepError) as e:
        check_one_change(members)
    assert "'fixed_h'" in str(e.value) and "algorithm.horizon: 8 (drgrpo) -> 10" in str(e.value)
    assert "'short'" not in str(e.value)
    assert [k for k, _, _ in members[1].diff] == ["budget.max_new_tokens"]


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_variant_that_changes_nothing_and_config_errors_are_refused(tmp_path):
    p = write(
        tmp_path,
        """
        name: same
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: noop, component: lr, overrides: [trainer.lr=3.0e-5]}
          - {label: logging_only, component: lr, overrides: [logger=none, trainer.progress=false]}
    """,
    )
    with pytest.raises(SweepError) as e:
        check_one_change(members_of(p, tmp_path))
    assert "variant 'noop' changes nothing relative to 'grpo'" in str(e.value)
    assert "variant 'logging_only' changes nothing" in str(e.value)

    bad = write(
        tmp_path,
        """
        name: bad
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: g1, component: group_size, overrides: [trainer.group_size=1]}
    """,
        "bad.yaml",
    )
    with pytest.raises(SweepError, match=r"variant 'g1': config error: trainer.group_size=1"):
        members_of(bad, tmp_path)


# ----------------------------------------------------------------------------- ladders
LADDER = """
    name: ladder
    mode: ladder
    seeds: [0, 1]
    base: {label: naive, overrides: [algorithm=grpo, algorithm.kl.coef=0.0]}
    variants:
      - {label: clip_higher, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
      - {label: token_mean, component: aggregation, overrides: [algorithm.aggregation=token-mean]}
      - {label: wider, component: clipping, overrides: [algorithm.clip.eps_high=0.3]}
"""


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_ladder_accumulates_overrides_and_chains_references(tmp_path):
    members = members_of(write(tmp_path, LADDER), tmp_path)
    check_one_change(members)
    names = [m.name for m in members]
    assert names == ["naive", "clip_higher", "token_mean", "wider"]
    assert [m.reference for m in members] == [None, "naive", "clip_higher", "token_mean"]
    assert [m.kind for m in members] == ["base", "rung", "rung", "rung"]
    tok = members[2]
    assert tok.overrides[:4] == [
        "algorithm=grpo",
        "algorithm.kl.coef=0.0",
        "algorithm.clip.eps_high=0.28",
        "algorithm.aggregation=token-mean",
    ]
    assert tok.config["algorithm"]["clip"]["eps_high"] == 0.28 and tok.config["algorithm"]["kl"]["coef"] == 0.0
    assert [k for k, _, _ in tok.diff] == ["algorithm.aggregation"]  # vs the previous rung only
    # a later rung that revisits a key replaces the earlier override instead of repeating it
    wider = members[3]
    assert "algorithm.clip.eps_high=0.28" not in wider.overrides and "algorithm.clip.eps_high=0.3" in wider.overrides
    assert wider.config["algorithm"]["aggregation"] == "token-mean"
    assert wider.diff == [("algorithm.clip.eps_high", 0.28, 0.3)]


def test_ladder_rung_that_changes_nothing_is_refused(tmp_path):
    p = write(
        tmp_path,
        """
        name: flat
        mode: ladder
        base: {label: naive, overrides: [algorithm=grpo]}
        variants:
          - {label: clip_higher, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
          - {label: again, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
    """,
    )
    with pytest.raises(SweepError, match="rung 'again' changes nothing relative to 'clip_higher'"):
        check_one_change(members_of(p, tmp_path))


def test_bad_sweep_files_are_refused_with_the_fix(tmp_path):
    cases = {
        "seed=1": "the sweep sets itself",
        "trainer.lr=1e-4,3e-4": "give each value its own variant",
        "hydra.sweep.dir=/x": "results_dir",
    }
    for override, expected in cases.items():
        p = write(
            tmp_path,
            f"""
            name: bad
            base: {{label: grpo, overrides: [algorithm=grpo]}}
            variants:
              - {{label: v, component: lr, overrides: ["{override}"]}}
        """,
        )
        with pytest.raises(SweepError, match=expected):
            load_sweep(p)
    p = write(
        tmp_path,
        """
        name: bad
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: v, component: clippin, overrides: [algorithm.clip.eps_high=0.3]}
    """,
    )
    with pytest.raises(SweepError, match="unknown component 'clippin'"):
        load_sweep(p)
    p = write(
        tmp_path,
        """
        name: bad
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: grpo, component: lr, overrides: [trainer.lr=3e-4]}
    """,
    )
    with pytest.raises(SweepError, match="unique"):
        load_sweep(p)


def test_every_component_names_existing_config_keys():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlcompare.cli import conf_dir, register_resolvers
    from rlcompare.config import validate

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = OmegaConf.to_container(validate(compose("config", overrides=["algorithm=ppo"])), resolve=True)
    keys = set(flatten(cfg))
    for name, prefixes in COMPONENTS.items():
        for p in prefixes:
            assert any(k == p or k.startswith(p + ".") for k in keys), f"{name}: {p} is not a config key"
    doc = (REPO / "docs" / "components.md").read_text()
    for name in COMPONENTS:
        assert f"| `{name}` |" in doc, f"docs/components.md lacks the component {name}"


# ----------------------------------------------------------------------------- shipped sweep files
@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
@pytest.mark.slow
def test_shipped_sweep_passes_dry_run(path, tmp_path, capsys):
    text = path.read_text()
    assert text.startswith("#"), "a shipped sweep states its question in a header comment"
    rc = run_sweep(path, [f"results_dir={tmp_path / 'results'}"], dry_run=True)
    out = capsys.readouterr().out
    assert rc == 0, out
    spec = load_sweep(path)
    assert spec.question and spec.name == path.stem
    assert "one-change check passed" in out
    for v in spec.variants:
        assert v.label in out
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_cli_dry_run_by_name_with_options_between_overrides(tmp_path, capsys):
    rc = main(["one_knob", "--dry-run", f"results_dir={tmp_path}", "--seeds", "0,1", "trainer.lr=3e-4"])
    out = capsys.readouterr().out
    assert rc == 0 and "seeds 0, 1" in out and "seed=0,1 " in out and "trainer.lr=3e-4" in out
    assert main(["one_knob", "--dry-run", "--seeds", "0,0"]) == 2


def test_shipped_sweep_set_is_complete():
    assert {p.stem for p in SWEEPS} >= {
        "presets",
        "dapo_ladder",
        "one_knob",
        "lr_sensitivity",
        "group_size",
        "clip_range",
        "countdown_lian2025",
    }
    presets = load_sweep(REPO / "sweeps" / "presets.yaml")
    assert presets.base.label == "grpo" and presets.seeds == [0, 1, 2, 3, 4]
    assert {v.label for v in presets.variants} == {"ppo", "drgrpo", "dapo", "gspo", "dhpo", "rloo"}
    assert all(v.component == ["algorithm"] for v in presets.variants)
    ladder = load_sweep(REPO / "sweeps" / "dapo_ladder.yaml")
    assert ladder.mode == "ladder" and len(ladder.variants) == 5


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
@pytest.mark.slow
def test_shipped_sweep_on_the_embedded_default_runs_at_least_five_seeds(path, tmp_path):
    """Issue 16: fewer than 5 seeds per arm is inconclusive; the default's runs are cheap, so ship enough."""
    members = members_of(path, tmp_path)
    on_default = all(
        m.config["model"]["kind"] == "tiny" and m.config["prompts"]["kind"] == "arithmetic" for m in members
    )
    spec = load_sweep(path)
    if not on_default:
        assert path.stem in ("countdown_lian2025", "gym_countdown", "envs"), (
            f"{path.name} left the embedded default: decide its seed count"
        )
        if path.stem == "envs":  # its calc member runs the lab task; every member is as cheap as the default's: 5
            assert len(set(spec.seeds)) >= 5
        return
    assert len(set(spec.seeds)) >= 5, f"{path.name}: seeds {spec.seeds}; runs on the default need at least 5"


# ----------------------------------------------------------------------------- running
@pytest.mark.parametrize("scenario", ["exit", "raise_then_exit"])
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_failure_isolation_relaunches_seeds_after_a_job_exits(tmp_path, scenario):
    """A job that exits (rather than raises) stops Hydra's basic launcher: the seeds after it are relaunched."""
    p = write(
        tmp_path,
        """
        name: iso
        seeds: [0, 1, 2, 3]
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: v, component: lr, overrides: [trainer.lr=3e-4]}
    """,
    )
    members = members_of(p, tmp_path)
    root = tmp_path / "results" / "iso"
    calls = []
    # "exit": seed 1 exits once started (Hydra made its folder), before writing a summary. "raise_then_exit":
    # seed 0 raises (summary failed, Hydra goes on), then seed 2 exits once started.
    raises, exits = ({-1}, {1}) if scenario == "exit" else ({0}, {2})

    def fake_launch(jobs):
        calls.append([j.seed for j in jobs])
        rc = 0
        for j in jobs:
            d = root / f"grpo__s{j.seed}"
            (d / ".hydra").mkdir(parents=True, exist_ok=True)
            (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(j.overrides(load_sweep(p))))
            if j.seed in exits:
                return 1
            status = "failed" if j.seed in raises else "completed"
            (d / "config.yaml").write_text(yaml.safe_dump({**j.member.config, "seed": j.seed}))
            (d / "summary.json").write_text(
                json.dumps({"status": status, "error": "ValueError: x" if j.seed in raises else None})
            )
            rc = 1 if j.seed in raises else rc
        return rc

    res = run_jobs([Job(members[0], s) for s in (0, 1, 2, 3)], root, fake_launch)
    res = {seed: r for (_, seed), r in res.items()}
    if scenario == "exit":
        assert calls == [[0, 1, 2, 3], [2, 3]]
        assert res[1]["status"] == "failed" and "exited with code 1" in res[1]["error"]
        assert all(res[s]["status"] == "completed" for s in (0, 2, 3))
    else:
        # the job that exited is told by its folder (Hydra made it when it started): one relaunch fewer than
        # when the first seed without a summary had to be blamed
        assert calls == [[0, 1, 2, 3], [3]]
        assert res[0] == {"status": "failed", "error": "ValueError: x", "dir": str(root / "grpo__s0")}
        assert res[2]["status"] == "failed" and "before this run wrote a summary" in res[2]["error"]
        assert res[1]["status"] == res[3]["status"] == "completed"


@pytest.mark.slow
def test_sweep_end_to_end_then_report(tmp_path, capsys):
    from rlcompare.report import build_report

    p = write(
        tmp_path,
        """
        # Question: does clip-higher change anything on a 3-step run? (plumbing test)
        name: e2e
        question: "plumbing"
        seeds: [0, 1]
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
          - {label: clip_higher, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
    """,
    )
    results = tmp_path / "results"
    extra = FAST + [f"results_dir={results}"]
    rc = run_sweep(p, extra)
    out = capsys.readouterr().out
    assert rc == 0, out
    root = results / "e2e"
    runs = sorted(d.name for d in root.iterdir() if d.is_dir())
    assert runs == ["clip_higher__s0", "clip_higher__s1", "grpo__s0", "grpo__s1"]
    for name in runs:
        s = json.loads((root / name / "summary.json").read_text())
        assert s["status"] == "completed" and s["experiment"] == "e2e"
        assert s["sweep"]["name"] == "e2e" and s["sweep"]["variant"] == name.split("__")[0]
        assert s["seed"] == int(name[-1])
    tags = json.loads((root / "clip_higher__s1" / "summary.json").read_text())["sweep"]
    assert tags["reference"] == "grpo" and tags["component"] == "algorithm.clip"
    assert json.loads((root / "grpo__s0" / "summary.json").read_text())["sweep"]["reference"] is None
    rec = yaml.safe_load((root / "sweep.yaml").read_text())
    assert rec["name"] == "e2e" and rec["created"] and rec["extra_overrides"] == extra
    assert "clip_higher" in rec["file"] and rec["members"][1]["overrides"][:2] == [
        "algorithm=grpo",
        "algorithm.clip.eps_high=0.28",
    ]
    assert rec["runs"]["grpo"]["0"]["status"] == "completed"
    assert f"rlcompare report {root}" in out

    res = build_report(root, out_dir=tmp_path / "report", reps=200)
    head = res["headline"].set_index("variant")
    assert set(head.index) == {"grpo", "clip_higher"}
    assert (head["n_seeds"] == 2).all() and head[["final_low", "final_high"]].notna().all().all()
    diff = res["differences"]
    assert set(diff["variant"]) == {"clip_higher"} and set(diff["reference"]) == {"grpo"} and diff["matched"].all()
    assert res["plots"] and all(Path(x).exists() for x in res["plots"])
    assert Path(res["report_path"]).exists()

    # a second launch refuses to write into the same runs; --resume keeps completed runs and reruns nothing
    with pytest.raises(SweepError, match="already holds runs"):
        run_sweep(p, extra)
    assert run_sweep(p, extra, resume=True) == 0
    with pytest.raises(SweepError, match="another config"):
        run_sweep(p, extra + ["trainer.lr=3e-4"], resume=True)


@pytest.mark.slow
def test_failing_member_does_not_stop_the_others(tmp_path, capsys):
    from rlcompare.report import build_report

    p = write(
        tmp_path,
        """
        name: fails
        seeds: [0]
        base: {label: boom, overrides: [algorithm=grpo, trainer.inject_nan_at_step=1, trainer.max_bad_steps=1]}
        variants:
          - {label: fine, component: [trainer.inject_nan_at_step, trainer.max_bad_steps],
             overrides: [trainer.inject_nan_at_step=null, trainer.max_bad_steps=5]}
    """,
    )
    results = tmp_path / "results"
    rc = run_sweep(p, FAST + [f"results_dir={results}"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "failed members (1)" in out and "boom (seed 0): FloatingPointError" in out
    root = results / "fails"
    assert json.loads((root / "boom__s0" / "summary.json").read_text())["status"] == "failed"
    assert (
        json.loads((root / "fine__s0" / "summary.json").read_text())["status"] == "completed"
    )  # ran after the failure
    assert yaml.safe_load((root / "sweep.yaml").read_text())["runs"]["boom"]["0"]["status"] == "failed"

    res = build_report(root, write=False, reps=50)
    runs = res["runs"].set_index("run")
    assert runs.loc["boom__s0", "status"] == "failed" and not runs.loc["boom__s0", "included"]
    assert runs.loc["fine__s0", "status"] == "completed"
    assert any("failed run" in f and "boom__s0" in f for f in res["flags"])


def test_resume_counts_a_key_an_older_run_lacks_as_the_default_it_held_then():
    """A run written before `algorithm.module`, `verifier.module` and the `env` group existed was made with their
    defaults: `--resume` keeps it. A member that sets the new key to something else is another config."""
    from rlcompare.sweep.jobs import _config_changes

    old_run = {"algorithm": {"name": "grpo", "clip": {"eps_low": 0.2}}, "verifier": {"name": "exact_match"}}
    member = {
        "algorithm": {"name": "grpo", "clip": {"eps_low": 0.2}, "module": None},
        "verifier": {"name": "exact_match", "module": None},
        "env": {"name": "none", "max_turns": 3},
    }
    assert _config_changes(member, old_run) == ""
    member["algorithm"]["module"] = "examples.shifted_clip"
    member["env"]["max_turns"] = 1
    assert _config_changes(member, old_run) == "algorithm.module: null -> examples.shifted_clip, env.max_turns: 3 -> 1"
