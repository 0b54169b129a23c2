"""A teacher named by a Hugging Face hub id is an input the run must pin (issue 62, point 2): under a bare id the hub
serves whatever its main branch holds at each load, so a resume or the next arm could score with other weights under
one config, and fingerprint.json recorded `revision: null` (not compared). A hub id now needs
`teacher.revision=<commit>`, refused without one before anything is read or downloaded (offline here: a download
attempt would fail another way), loaded at that commit and recorded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rlcompare.config import ConfigError
from rlcompare.train.inputs import differences, external_inputs
from rlcompare.train.teacher_check import check_hub_revision, check_teacher

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def no_hub(monkeypatch):
    """Any tokenizer, model or hub file load fails the test: the checks must refuse before one is attempted."""
    import huggingface_hub
    import transformers

    def attempted(*a, **k):
        raise AssertionError(f"a load was attempted: {a}")

    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", attempted)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", attempted)


def test_an_unpinned_hub_teacher_is_refused_naming_the_key_and_both_fixes(compose, no_hub):
    cfg = compose("algorithm=opd", "teacher.path=someorg/some-teacher")
    with pytest.raises(ConfigError) as refused:
        check_teacher(cfg)
    msg = str(refused.value)
    assert "teacher.path='someorg/some-teacher' is not a local folder" in msg
    assert "teacher.revision=<its commit hash" in msg and "huggingface-cli download someorg/some-teacher" in msg


@pytest.mark.parametrize("revision", ["main", "v1.0", COMMIT[:12], COMMIT.upper()])
def test_a_branch_tag_or_short_hash_is_not_a_pin(revision):
    with pytest.raises(ConfigError, match=r"teacher.revision=.* is not a commit hash \(40 lowercase hex digits\)"):
        check_hub_revision("someorg/some-teacher", revision)


def test_a_revision_on_a_local_folder_is_refused_and_a_pinned_hub_id_passes(tmp_path):
    with pytest.raises(ConfigError, match="is a local path .* set teacher.revision=null"):
        check_hub_revision(str(tmp_path), COMMIT)
    check_hub_revision(str(tmp_path), None)
    check_hub_revision("someorg/some-teacher", COMMIT)


def test_the_loader_refuses_an_unpinned_hub_id_too(no_hub):
    """`load_teacher` is reached without the command line's check when train(cfg) is called from Python."""
    import torch

    from rlcompare.train.teacher import load_teacher

    with pytest.raises(ConfigError, match="teacher.revision"):
        load_teacher("someorg/some-teacher", dtype=torch.float32, device="cpu")


def test_the_pinned_commit_is_the_recorded_identity():
    then = external_inputs({"teacher": {"path": "someorg/some-teacher", "revision": COMMIT}})
    assert then == {"teacher.path": {"kind": "hub", "id": "someorg/some-teacher", "revision": COMMIT}}
    now = external_inputs({"teacher": {"path": "someorg/some-teacher", "revision": "f" * 40}})
    assert differences(then, now) == [f"teacher.path revision: {COMMIT!r} in the run, {'f' * 40!r} now"]


def test_a_sweep_with_an_unpinned_hub_teacher_is_refused_before_any_launch(tmp_path):
    from rlcompare.sweep import SweepError, run_sweep

    p = tmp_path / "hubopd.yaml"
    p.write_text(
        textwrap.dedent("""
        name: hubopd
        seeds: [0]
        base: {label: opd, overrides: [algorithm=opd, teacher.path=someorg/some-teacher]}
        variants:
          - {label: opd_clip, component: clipping, overrides: [algorithm.clip.eps_high=0.28]}
        """)
    )
    with pytest.raises(SweepError, match=r"base 'opd': config error: teacher.path='someorg/some-teacher' .*revision"):
        run_sweep(p, [f"results_dir={tmp_path / 'results'}"], dry_run=True)


def test_rlcompare_train_refuses_an_unpinned_hub_teacher_offline(tmp_path):
    """The user's way: exit 2 with the one-line refusal, no traceback and no download attempt (the hub endpoint is
    unreachable: an attempt would end in a connection error instead)."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "rlcompare.cli", "train", "algorithm=opd", "teacher.path=someorg/some-teacher"]
    cmd.append(f"results_dir={tmp_path / 'results'}")
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "teacher.revision=<its commit hash" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "results").exists()
