"""A variant whose sweep sets an input per seed (c14: `teacher.path=.../teacher_s10${seed}/export`, a teacher per
seed) is one arm, not an unmatched one: its runs differ there by design, which the report reads from the sweep's
own record (sweep.yaml beside the runs, as data) and says so in a note. Without that record the same runs are
flagged as unmatched, as before: nothing else about them is taken on trust."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rlcompare.report import build_report
from tests.report.test_report import make_run

ACCS = {"grpo": (0.2, 0.3, 0.4), "opd": (0.2, 0.35, 0.5)}


def _folder(root: Path, record: bool) -> Path:
    for seed in range(3):
        make_run(root, f"grpo__s{seed}", seed, ACCS["grpo"], variant="grpo", component="[]")
        d = root / "exp" / f"opd__s{seed}"
        make_run(root, f"opd__s{seed}", seed, ACCS["opd"], variant="opd", reference="grpo", component="teacher")
        with open(d / "config.yaml", "a") as f:  # each seed's own teacher, in the config and in its inputs
            f.write(f"teacher:\n  path: t/teacher_s10{seed}\n")
        fp = json.loads((d / "fingerprint.json").read_text())
        fp["inputs"] = {"teacher.path": {"weights_sha256": f"w10{seed}", "location": f"/x/t/teacher_s10{seed}"}}
        (d / "fingerprint.json").write_text(json.dumps(fp))
    if record:
        members = [
            {"label": "grpo", "overrides": ["algorithm=grpo"]},
            {"label": "opd", "overrides": ["algorithm=opd", "teacher.path=t/teacher_s10${seed}"]},
        ]
        (root / "exp" / "sweep.yaml").write_text(yaml.safe_dump({"name": "sw", "members": members}))
    return root / "exp"


def test_an_input_the_sweep_sets_per_seed_is_one_arm_with_a_note(tmp_path):
    res = build_report(_folder(tmp_path, record=True), out_dir=tmp_path / "out", min_seeds=3, reference="grpo")
    assert not [f for f in res["flags"] if "Unmatched" in f], res["flags"]
    assert any("`teacher.path` set per seed by its sweep" in n for n in res["notes"])
    window = res["differences"].set_index("quantity").loc["window"]
    assert window["variant"] == "opd" and window["n_variant"] == 3


def test_without_the_sweeps_record_the_same_runs_are_unmatched(tmp_path):
    res = build_report(_folder(tmp_path, record=False), out_dir=tmp_path / "out", min_seeds=3, reference="grpo")
    flag = next(f for f in res["flags"] if "Unmatched runs within `opd`" in f)
    assert "teacher.path" in flag
    assert res["differences"].empty
