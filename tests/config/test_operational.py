"""The operational keys are defined once (rlcompare.config.operational): Hydra's exclude_keys (YAML, which cannot import
Python), docs/components.md, resume, sweeps, fingerprints and the report read the same list."""

import re
from pathlib import Path

from omegaconf import OmegaConf

from rlcompare.config import operational
from rlcompare.report import build as report
from rlcompare.sweep import spec as sweep
from rlcompare.train import resume, run
from rlcompare.train.app import conf_dir
from rlcompare.config import RunConfig
from rlcompare.config.flat import flatten

ROOT = Path(__file__).resolve().parents[2]


def _schema_keys() -> set[str]:
    return set(flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig))))


def test_every_operational_key_is_a_schema_key_with_a_reason():
    keys = _schema_keys()
    for table in (operational.OPERATIONAL, operational.RESUME_FIXED):
        for key, why in table.items():
            assert key in keys, key
            assert why.strip() and "\n" not in why, key
    assert set(operational.RESUME_FIXED) <= set(operational.OPERATIONAL)
    assert "seed" not in operational.OPERATIONAL  # it changes what a run computes


def test_every_key_of_the_logger_and_sweep_sections_is_operational():
    # `logger` is excluded from run names as a whole group, and the sweep tags are bookkeeping: a key added there
    # must be listed (with its reason) too
    for key in _schema_keys():
        if key.split(".")[0] in ("logger", "sweep"):
            assert key in operational.OPERATIONAL, key


def test_hydra_exclude_keys_equal_the_python_list():
    yaml_keys = OmegaConf.load(Path(conf_dir()) / "config.yaml").hydra.job.config.override_dirname.exclude_keys
    assert list(yaml_keys) == list(operational.RUN_NAME_EXCLUDED)
    # the deliberate differences with OPERATIONAL, each commented in rlcompare/config/operational.py
    assert set(yaml_keys) - set(operational.OPERATIONAL) == set(operational.NAME_ONLY)


def test_docs_components_lists_the_keys_a_sweep_never_counts():
    text = (ROOT / "docs" / "components.md").read_text()
    para = text[text.index("**Keys that never count as a change**") :]
    para = para[: para.index("\n\n")]
    listed = re.findall(r"`([a-z_.]+)`", para.split(":", 1)[1].split("):", 1)[1])
    assert listed == list(operational.SWEEP_IGNORED)


def test_resume_sweep_fingerprint_and_report_read_the_same_keys():
    assert resume.RESUME_IGNORED == set(operational.OPERATIONAL) - set(operational.RESUME_FIXED)
    assert sweep.IGNORED_KEYS == operational.SWEEP_IGNORED
    for key in operational.OPERATIONAL:
        assert sweep._ignored(key), key
    # fingerprint.json written before these were left out: a difference there is no difference
    a = {"verifier": {"probe": True, "timeout_s": 2.0}, "sampling": {"kv_cache": "auto", "temperature": 1.0}}
    b = {"verifier": {"probe": False, "timeout_s": 2.0}, "sampling": {"kv_cache": "dynamic", "temperature": 1.0}}
    assert report.fingerprint_diff(a, b) == []
    b["sampling"]["temperature"] = 0.7
    assert report.fingerprint_diff(a, b) == ["sampling.temperature: 1.0 vs 0.7"]


def test_fingerprint_leaves_out_operational_keys():
    class _Splits:
        def eval_hash(self):
            return "h"

    class _Policy:
        init_hash, warm_start_key, source = "w", "k", "tiny"

    class _Trainer:
        train_prompts, eval_prompts, splits, policy = [1], [1], _Splits(), _Policy()

    cfg = OmegaConf.structured(RunConfig)
    fp = flatten(run.fingerprint(cfg, _Trainer()))
    assert "verifier.probe" not in fp and "sampling.kv_cache" not in fp
    assert "verifier.timeout_s" in fp and "sampling.temperature" in fp
