"""Where a run goes (issue 18): `run_name` and `experiment` name one folder inside `results_dir` (`../` escaped it
before), and a `results_dir` (or `model.cache_dir`) that cannot be created is a config error naming the key."""

from __future__ import annotations

import os

import pytest

from rlcompare.config import ConfigError, validate
from rlcompare.train.run import train


@pytest.fixture
def no_heavy_work(monkeypatch):
    from rlcompare.models import load as models
    from rlcompare.train import trainer

    def heavy(*a, **k):
        raise AssertionError("heavy work started before the bad config was refused")

    monkeypatch.setattr(trainer.Trainer, "__init__", heavy)
    monkeypatch.setattr(models, "warm_start_tiny", heavy)


ESCAPES = ["../outside", "../../etc", "/tmp/abs", "a/b", "a\\b", "..", ".", "", " ", "x" * 256]


@pytest.mark.parametrize("key", ["run_name", "experiment"])
@pytest.mark.parametrize("value", ESCAPES, ids=[repr(v[:12]) for v in ESCAPES])
@pytest.mark.slow
def test_run_name_and_experiment_cannot_leave_results_dir(compose, tmp_path, no_heavy_work, key, value):
    with pytest.raises(ConfigError, match=rf"^{key}=.* must be one folder name inside results_dir"):
        train(compose(f"{key}='{value}'"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, inside or outside results_dir


@pytest.mark.parametrize("key", ["run_name", "experiment"])
@pytest.mark.slow
def test_plain_names_are_accepted(compose, key):
    assert validate(compose(f"{key}=lr-1e-3_v2.b")).get(key) == "lr-1e-3_v2.b"


def _uncreatable(tmp_path):
    (tmp_path / "a_file").write_text("x")
    return {
        "under a file": (str(tmp_path / "a_file" / "results"), "not a folder"),
        "under /proc": ("/proc/rlcompare-results", "checked /proc"),  # root may write anywhere else
        "a name too long": (str(tmp_path / ("n" * 300) / "r"), "longer than 255 bytes"),
        "empty": ("", "an empty path"),
    }


@pytest.mark.parametrize("case", ["under a file", "under /proc", "a name too long", "empty"])
@pytest.mark.parametrize("key", ["results_dir", "model.cache_dir"])
@pytest.mark.slow
def test_a_folder_that_cannot_be_created_names_its_key(compose, tmp_path, no_heavy_work, key, case):
    path, why = _uncreatable(tmp_path)[case]
    with pytest.raises(ConfigError, match=rf"^{key}=.* is not writable \(.*{why}"):
        train(compose(f"{key}='{path}'"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.slow
def test_the_writability_check_leaves_nothing_behind(compose, tmp_path):
    validate(compose(f"results_dir={tmp_path / 'new' / 'results'}"))
    assert os.listdir(tmp_path) == []  # it made and removed its probe folder in tmp_path, created nothing else
