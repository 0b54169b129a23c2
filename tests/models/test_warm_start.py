"""The tiny policy's warm start: shipped weights for the embedded default (the same on every machine), computed
and cached locally for any other config; safetensors only; the wheel ships conf/ and the weights."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlcompare.models import load as models
from rlcompare.config import validate
from rlcompare.data.prompts import build_prompts
from rlcompare.train.run import train

REPO = Path(__file__).resolve().parents[2]
# Content address of the shipped default warm start: models.weights_hash of its tensors (sha256 over sorted
# parameter names and fp32 bytes, first 16 hex digits; the tied lm_head.weight is the embedding). Made once by
# `python scripts/make_warm_start.py`; a fresh warm start computed on another machine hashes differently.
DEFAULT_INIT_WEIGHTS_HASH = "ffae552b83d9c1ad"
# The lab task's (prompts=chain, docs/claims.md): `python scripts/make_warm_start.py prompts=chain`
LAB_INIT_WEIGHTS_HASH = "8c9ed7db31104695"
# run settings only: no model.* or prompts.* override, so the warm start is the embedded default's
RUN_ONLY = [
    "budget=tiny",
    "logger=none",
    "trainer.progress=false",
    "trainer.threads=1",
    "trainer.prompts_per_step=2",
    "trainer.group_size=2",
    "trainer.eval_every=3",
]
REGENERATE = "regenerate it with `python scripts/make_warm_start.py` and update DEFAULT_INIT_WEIGHTS_HASH"


def _no_fresh_warm_start(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("computed a fresh warm start instead of loading the shipped one")

    monkeypatch.setattr(models, "_train_warm_start", refuse)


def _default_key(cfg) -> str:
    return models._warm_start_key(cfg.model, models.warm_start_table(build_prompts(cfg.prompts)))


def _lab_key(cfg) -> str:
    return models._warm_start_key(
        cfg.model, models.warm_start_table(build_prompts(cfg.prompts), cfg.prompts), cfg.prompts
    )


def _file_hash(folder: Path) -> str:
    """models.weights_hash's formula applied to the file's tensors directly (no model built)."""
    tensors = load_file(str(folder / models.SHIPPED_WEIGHTS))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]  # tied: save_pretrained stores it once
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- the shipped default
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_default_run_starts_from_the_shipped_weights(compose, monkeypatch):
    _no_fresh_warm_start(monkeypatch)
    cfg = compose(*RUN_ONLY, fast=False)
    default = compose(fast=False)
    assert cfg.model == default.model and cfg.prompts == default.prompts  # the test really runs the default's start
    s = train(cfg)
    fp = json.loads((Path(s["run_dir"]) / "fingerprint.json").read_text())
    assert fp["init_weights_hash"] == DEFAULT_INIT_WEIGHTS_HASH, REGENERATE
    summary = json.loads((Path(s["run_dir"]) / "summary.json").read_text())
    assert summary["warm_start_origin"] == "shipped"


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_shipped_file_is_the_default_configs_warm_start(compose):
    """A change to conf/model/tiny.yaml, conf/prompts/arithmetic.yaml, the prompt generator or the recipe's
    version changes the key: this fails until the shipped file is regenerated."""
    key = _default_key(validate(compose(fast=False)))
    shipped = sorted(p.name for p in models.SHIPPED_WARM_STARTS.iterdir() if p.is_dir())
    lab = _lab_key(validate(compose("prompts=chain", fast=False)))
    assert shipped == sorted([key, lab]), (
        f"shipped warm starts {shipped}, the default config's key is {key} and the lab task's {lab}: {REGENERATE}"
    )
    folder = models.SHIPPED_WARM_STARTS / key
    manifest = json.loads((folder / models.SHIPPED_MANIFEST).read_text())
    assert manifest["key"] == key and manifest["init_weights_hash"] == DEFAULT_INIT_WEIGHTS_HASH
    assert _file_hash(folder) == DEFAULT_INIT_WEIGHTS_HASH
    assert (folder / models.SHIPPED_WEIGHTS).stat().st_size < 4_000_000  # a few MB at most in the package


def test_shipped_weights_take_precedence_over_a_local_cache_entry_for_the_same_key(compose, tmp_path, monkeypatch):
    """A user who computed this warm start locally (other weights) now gets the shipped ones."""
    from transformers import LlamaForCausalLM

    cfg = validate(compose(*RUN_ONLY, f"model.cache_dir={tmp_path}", fast=False))
    key = _default_key(cfg)
    torch.manual_seed(1)
    local = LlamaForCausalLM(models.tiny_model_config(cfg.model, models.build_char_tokenizer()))
    models._save_atomically(local, models.build_char_tokenizer(), tmp_path / "warmstart" / key)
    _no_fresh_warm_start(monkeypatch)
    lines = []
    policy = models.load_policy(cfg, build_prompts(cfg.prompts), "cpu", log=lines.append)
    assert policy.init_hash == DEFAULT_INIT_WEIGHTS_HASH != models.weights_hash(local)
    assert policy.warm_start_origin == "shipped" and policy.warm_start_key == key
    assert any("shipped with rlcompare" in line and "the same on every machine" in line for line in lines)


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_change_that_keeps_the_table_keeps_the_key_and_one_that_changes_it_does_not(compose):
    """The key hashes the table the warm start trains on: a+b with a, b in 0..19 is 20 x 20 = 400 pairs
    whatever prompts.n_eval splits off; max_operand=18 gives 19 x 19 = 361 pairs."""
    default = validate(compose(fast=False))
    fewer_eval = validate(compose("prompts.n_eval=16", fast=False))
    smaller = validate(compose("prompts.max_operand=18", fast=False))
    longer = validate(compose("model.warm_start.steps=301", fast=False))
    assert len(models.warm_start_table(build_prompts(default.prompts))) == 400
    assert len(models.warm_start_table(build_prompts(smaller.prompts))) == 361
    assert _default_key(fewer_eval) == _default_key(default)
    assert len({_default_key(default), _default_key(smaller), _default_key(longer)}) == 3


# ----------------------------------------------------------------------------- any other config
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_non_default_warm_start_is_computed_here_and_cached(compose, tmp_path, monkeypatch):
    cfg = validate(compose(f"model.cache_dir={tmp_path}"))  # FAST: model.warm_start.steps=20
    splits = build_prompts(cfg.prompts)
    lines = []
    monkeypatch.setattr(models, "WARM_START_PROGRESS_S", 0.0)  # a progress line every step
    first = models.warm_start_tiny(cfg.model, cfg.prompts, splits, log=lines.append)
    assert first.origin == "computed" and not (models.SHIPPED_WARM_STARTS / first.key).exists()
    assert Path(first.folder) == tmp_path / "warmstart" / first.key
    assert (Path(first.folder) / "model.safetensors").is_file()
    # #63: progress while it trains, and "cached as" only once it is
    assert "computed on this machine" in lines[0] and "20 supervised steps" in lines[0] and "cached" not in lines[0]
    assert [line.split(" (")[0] for line in lines[1:-1]] == [
        f"[rlcompare] warm start: step {i}/20" for i in range(1, 21)
    ]
    assert lines[-1].startswith("[rlcompare] warm start: done in ") and f"cached as {first.key}" in lines[-1]
    _no_fresh_warm_start(monkeypatch)  # the second run reads the cache
    policy = models.load_policy(cfg, splits, "cpu", log=lines.append)
    assert policy.warm_start_origin == "cached" and policy.warm_start_key == first.key
    assert policy.init_hash != DEFAULT_INIT_WEIGHTS_HASH
    assert "computed on this machine earlier" in lines[-1]


def test_a_cached_warm_start_without_safetensors_is_refused_not_unpickled(compose, tmp_path):
    """A cache folder whose weights are a pickle file: the loader asks for model.safetensors and never opens
    the .bin (here bytes that are no pickle at all, so an attempt would fail with an UnpicklingError)."""
    cfg = validate(compose(f"model.cache_dir={tmp_path}"))
    splits = build_prompts(cfg.prompts)
    folder = tmp_path / "warmstart" / models._warm_start_key(cfg.model, models.warm_start_table(splits))
    folder.mkdir(parents=True)
    models.tiny_model_config(cfg.model, models.build_char_tokenizer()).save_pretrained(folder)
    models.build_char_tokenizer().save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(RuntimeError, match="could not be loaded.*delete that folder"):
        models.load_policy(cfg, splits, "cpu", log=lambda _: None)


# ----------------------------------------------------------------------------- the shipped loader
def _shipped_copy(tmp_path: Path) -> Path:
    """A copy of the default's shipped warm start (the folder order on disk is arbitrary: the lab task ships one too)."""
    src = next(
        p
        for p in sorted(models.SHIPPED_WARM_STARTS.iterdir())
        if p.is_dir()
        and json.loads((p / models.SHIPPED_MANIFEST).read_text())["init_weights_hash"] == DEFAULT_INIT_WEIGHTS_HASH
    )
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_the_shipped_loader_refuses_a_pickle_weight_file(compose, tmp_path):
    folder = _shipped_copy(tmp_path)
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(RuntimeError, match=r"pickle weight files \['pytorch_model.bin'\].*never loads"):
        models.load_shipped_warm_start(folder, compose(fast=False).model)


def test_the_shipped_loader_refuses_tensors_that_differ_from_the_manifest(compose, tmp_path):
    folder = _shipped_copy(tmp_path)
    tensors = load_file(str(folder / models.SHIPPED_WEIGHTS))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1e-3
    save_file(tensors, str(folder / models.SHIPPED_WEIGHTS), metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match=f"manifest says {DEFAULT_INIT_WEIGHTS_HASH}.*damaged"):
        models.load_shipped_warm_start(folder, compose(fast=False).model)


def test_the_shipped_loader_refuses_tensors_of_another_shape(compose, tmp_path):
    folder = _shipped_copy(tmp_path)
    with pytest.raises(RuntimeError, match="does not fit the tiny model"):
        models.load_shipped_warm_start(folder, compose("model.hidden_size=64", fast=False).model)


# ----------------------------------------------------------------------------- packaging
@pytest.mark.slow
def test_the_wheel_ships_conf_and_the_warm_start_and_a_wheel_install_finds_them(tmp_path):
    """conf/ sits at the repo root but must ship as rlcompare/conf (cli.conf_dir's packaged copy)."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("rlcompare", "conf", "hydra_plugins"):  # every folder pyproject's `packages` names
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    wheel = next((tmp_path / "dist").glob("rlcompare-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    conf_files = {f"rlcompare/conf/{p.relative_to(REPO / 'conf').as_posix()}" for p in (REPO / "conf").rglob("*.yaml")}
    assert conf_files and conf_files <= names, f"missing from the wheel: {sorted(conf_files - names)}"
    modules = {f"rlcompare/{p.relative_to(REPO / 'rlcompare').as_posix()}" for p in (REPO / "rlcompare").rglob("*.py")}
    assert modules <= names, (
        f"missing from the wheel (a subpackage not in pyproject's `packages`?): {sorted(modules - names)}"
    )
    shipped = {
        f"rlcompare/models/warmstart/{p.relative_to(models.SHIPPED_WARM_STARTS).as_posix()}"
        for p in models.SHIPPED_WARM_STARTS.rglob("*")
        if p.is_file()
    }
    assert shipped and shipped <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from rlcompare import cli, models; "
        "print(cli.conf_dir()); print(models.SHIPPED_WARM_STARTS)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(site)], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout.split()
    assert out == [str(site / "rlcompare" / "conf"), str(site / "rlcompare" / "models" / "warmstart")]


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_lab_task_ships_its_warm_start_too(compose, monkeypatch):
    """prompts=chain starts from shipped weights as the default does: its own key (the task's recipe is in it),
    its own content hash; the default's key is not moved by the lab's code path."""
    cfg = validate(compose("prompts=chain", fast=False))
    key = _lab_key(cfg)
    assert key != _default_key(validate(compose(fast=False)))
    folder = models.SHIPPED_WARM_STARTS / key
    manifest = json.loads((folder / models.SHIPPED_MANIFEST).read_text())
    assert manifest["key"] == key and manifest["init_weights_hash"] == LAB_INIT_WEIGHTS_HASH
    assert _file_hash(folder) == LAB_INIT_WEIGHTS_HASH
    _no_fresh_warm_start(monkeypatch)
    got = models.warm_start_tiny(cfg.model, cfg.prompts, build_prompts(cfg.prompts), log=lambda *a: None)
    assert (got.key, got.origin) == (key, "shipped")
