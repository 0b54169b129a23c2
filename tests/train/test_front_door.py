"""#63, the front door: checks that can run before the tiny model's warm start (minutes on a long prompt set) do (a
chat template the tokenizer lacks, prompts none of which fits budget.max_prompt_tokens, a setting of another model
preset: LoRA on the tiny model was Hydra's generic 'not in struct'); an unknown surrogate points at
algorithm.module; summary.json records a teacher's absolute path; a copied completed run resumed names the copy."""

from __future__ import annotations

import pytest

import rlcompare.models.load as load
from rlcompare.config import ConfigError
from rlcompare.train.model_folder import check_chat_template
from rlcompare.train.precheck import check_train_args
from rlcompare.train.run import train


def test_lora_on_the_tiny_model_names_the_preset_and_the_fix():
    err = check_train_args(["model.lora.enabled=true"])
    assert err.startswith("model.lora.enabled=true: model=tiny has no 'model.lora.enabled' (LoRA adapters")
    assert "use model=hf model.name_or_path=" in err and "not in struct" not in err
    err = check_train_args(["model=hf", "model.name_or_path=x", "model.hidden_size=8"])
    assert "model=hf has no 'model.hidden_size'; it is a setting of model=tiny" in err


def test_a_chat_prompt_set_on_the_tiny_model_is_refused_by_the_command_lines_check():
    err = check_train_args(["prompts=reasoning_gym", "verifier=reasoning_gym"])  # chat: true in its preset
    assert err.startswith("prompts.chat=true (prompts=reasoning_gym): the tiny model's character tokenizer has no")
    assert "prompts.chat=false prompts.template=plain" in err


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["++prompts.chat=true"], "character tokenizer has no chat template"),
    ],
)
def test_train_refuses_before_the_warm_start(compose, monkeypatch, overrides, match):
    monkeypatch.setattr(load, "warm_start_tiny", lambda *a, **k: pytest.fail("the warm start ran before the check"))
    with pytest.raises(ConfigError, match=match):
        train(compose(*overrides))


def test_a_local_folder_without_a_chat_template_is_refused(compose, tmp_path):
    from rlcompare.models import build_char_tokenizer

    build_char_tokenizer().save_pretrained(tmp_path / "m")
    cfg = compose("model=hf", f"model.name_or_path={tmp_path / 'm'}", "++prompts.chat=true", fast=False)
    with pytest.raises(ConfigError, match="tokenizer of model.name_or_path=.* has no chat template"):
        check_chat_template(cfg)
    (tmp_path / "m" / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    check_chat_template(cfg)


def test_an_unknown_surrogate_points_at_algorithm_module():
    err = check_train_args(["algorithm.surrogate=xyz"])
    assert "use one of: clip" in err and "algorithm.module=<the module that registers 'xyz'>" in err


def test_summary_records_a_relative_teacher_path_as_given_and_absolute(compose, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from rlcompare.train.run import _opening_summary

    (tmp_path / "teach").mkdir()
    monkeypatch.chdir(tmp_path)
    world = SimpleNamespace(size=1, mode="none", shared_memory=False)
    s = _opening_summary(compose("++teacher.path=teach"), tmp_path / "run", world)
    assert s["teacher"] == {"path": "teach", "absolute_path": str(tmp_path.resolve() / "teach")}
    assert "teacher" not in _opening_summary(compose(), tmp_path / "run", world)


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_resuming_a_copied_completed_run_names_the_copy(compose, tmp_path):
    import shutil
    from pathlib import Path

    s = train(compose("budget.max_steps=1", "trainer.eval_every=1"))
    copy = tmp_path / "copy"
    shutil.copytree(s["run_dir"], copy)
    again = train(compose("budget.max_steps=1", "trainer.eval_every=1", f"resume={copy}"))
    assert again["run_dir"] == str(copy) and again["run_name"] == "copy" and again["steps"] == 1
    assert Path(s["run_dir"]).name != "copy"
