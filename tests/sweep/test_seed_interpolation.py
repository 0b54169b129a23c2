"""A member whose override interpolates the seed (c14: `teacher.path=results/c14_teachers/teacher_s10${seed}/export`,
a teacher per seed) is checked at each seed against the config that seed's run was launched with, not the first
seed's: the runs of seeds 1-4 are this member's runs (the first c14 rerun listed them as "another command wrote
the folder"), a folder holding seed 0's teacher under seed 3 is not, and --resume reads each seed's own teacher."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlcompare.sweep import jobs
from rlcompare.sweep.launch import Job
from rlcompare.sweep.resolve import prepare

REPO = Path(__file__).resolve().parents[2]
C14 = REPO / "sweeps" / "claims" / "c14_on_policy_distillation.yaml"


def _members():
    _, members = prepare(str(C14), ["logger=none"])
    return {m.name: m for m in members}


def test_each_seed_resolves_its_own_teacher_and_the_rest_of_the_config_is_the_members():
    opd = _members()["opd"]
    assert opd.config["teacher"]["path"] == "results/c14_teachers/teacher_s100/export"  # composed at seed 0
    at3 = opd.config_at(3)
    assert at3["teacher"]["path"] == "results/c14_teachers/teacher_s103/export" and at3["seed"] == 3
    assert {k: v for k, v in at3.items() if k not in ("teacher", "seed")} == {
        k: v for k, v in opd.config.items() if k not in ("teacher", "seed")
    }
    assert opd.config["teacher"]["path"].endswith("teacher_s100/export")  # the member itself is left as it was
    grpo = _members()["grpo"]
    assert grpo.config_at(3) is grpo.config  # nothing interpolates: the same dict


def test_a_run_of_seed_3_with_its_own_teacher_is_the_members_and_one_with_seed_0s_is_not(tmp_path):
    opd = _members()["opd"]
    run = tmp_path / "opd__s3"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(opd.config_at(3)))
    assert jobs._not_this_members_run(run, Job(opd, 3), "completed") is None
    (run / "config.yaml").write_text(yaml.safe_dump({**opd.config, "seed": 3}))  # seed 0's teacher under seed 3
    why = jobs._not_this_members_run(run, Job(opd, 3), "completed")
    assert "teacher.path: results/c14_teachers/teacher_s100/export -> results/c14_teachers/teacher_s103/export" in why
