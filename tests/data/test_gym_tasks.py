"""`prompts=reasoning_gym`: any dataset reasoning-gym lists, by name; train and held-out splits from two seeds that
never share an entry; rlcompare's templates; an unknown name refused (with the list) before training; the verifier
probe covers the set."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlcompare.config import ConfigError, validate
from rlcompare.data.gym_tasks import check_disjoint, task_names
from rlcompare.data.prompts import Example, build_prompts
from rlcompare.train.verifier_probe import check_verifier_reads_prompts
from rlcompare.rewards.gym_verifier import decode_reference, make_dataset
from rlcompare.rewards.verifiers import build_verifier
from rlcompare.train.run import preflight, train

# the tiny model has no chat template: the plain form its refusal names (tests/train/test_front_door.py)
GYM = ["prompts=reasoning_gym", "verifier=reasoning_gym", "prompts.n_train=30", "prompts.n_eval=6"]
GYM += ["prompts.chat=false", "prompts.template=plain"]


def _set(task="chain_sum", **over):
    cfg = {"kind": "reasoning_gym", "task": task, "task_config": {}, "train_seed": 1, "eval_seed": 1000}
    cfg.update(n_train=40, n_eval=10, template="r1_chat", chat=True, system_prompt=None)
    cfg.update(over)
    return OmegaConf.create(cfg)


def test_splits_come_from_two_seeds_and_never_share_an_entry():
    s = build_prompts(_set("basic_arithmetic"))
    assert len(s.eval) == 10 and 0 < len(s.train) <= 40 and s.chat
    check_disjoint(s.train, s.eval)
    assert {decode_reference(ex.answer)["seed"] for ex in s.train} == {1}
    assert {decode_reference(ex.answer)["seed"] for ex in s.eval} == {1000}
    ex = s.eval[0]
    ref = decode_reference(ex.answer)
    entry = make_dataset(ref["task"], ref["config"], ref["seed"], ref["size"])[ref["index"]]
    assert ex.prompt.startswith(entry["question"]) and "<answer>" in ex.prompt  # r1_chat around the question
    assert ex.meta["answer_text"] == str(entry["answer"]) == ref["answer"]


def test_a_small_task_space_drops_the_held_out_questions_from_train():
    # chain_sum with 2 one-digit terms has few distinct questions: many repeat across seeds
    s = build_prompts(_set("chain_sum", task_config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}))
    held = {ex.meta["question"] for ex in s.eval}
    assert s.train and not any(ex.meta["question"] in held for ex in s.train)
    with pytest.raises(ValueError, match="held-out question"):
        check_disjoint([Example("q", "a", {"question": "same"})], [Example("q", "a", {"question": "same"})])


def test_seed_ranges_that_meet_are_refused():
    # reasoning-gym draws entry i from seed + i: seeds 1 and 2 share all but one entry
    with pytest.raises(ValueError, match="train_seed=1.*eval_seed=2.*share entries"):
        build_prompts(_set(eval_seed=2))
    with pytest.raises(ValueError, match="both 5"):
        build_prompts(_set(train_seed=5, eval_seed=5))


def test_template_plain_and_a_literal():
    s = build_prompts(_set(template="plain"))
    assert s.eval[0].prompt == s.eval[0].meta["question"]
    s = build_prompts(_set(template="Q: {question}\nA:"))
    assert s.eval[0].prompt == f"Q: {s.eval[0].meta['question']}\nA:"


def test_unknown_task_and_bad_config_are_refused_before_training(compose, tmp_path):
    with pytest.raises(
        ConfigError, match="prompts.task='countdwn' is not a reasoning-gym dataset; use one of: .*countdown"
    ):
        train(compose(*GYM, "prompts.task=countdwn"))
    with pytest.raises(ConfigError, match="prompts.task_config=.*not accepted by reasoning-gym's countdown"):
        train(compose(*GYM, "prompts.task=countdown", "+prompts.task_config.min_numbers=9"))
    assert not (tmp_path / "results").exists()  # refused before the run folder


def test_every_listed_task_name_is_accepted():
    names = task_names()
    assert len(names) > 90 and {"countdown", "basic_arithmetic", "chain_sum", "gsm_symbolic", "puzzle24"} <= set(names)


@pytest.mark.slow
def test_every_listed_task_builds_or_names_its_config():
    for name in task_names():
        try:
            s = build_prompts(_set(name, n_train=2, n_eval=1, eval_seed=100))
        except ValueError as e:  # composite needs its datasets listed: a config error, not an unknown name
            assert "prompts.task_config" in str(e) and "not a reasoning-gym dataset" not in str(e), name
            continue
        assert s.eval and s.train, name


@pytest.mark.parametrize("task", ["countdown", "gsm_symbolic"])
@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_verifier_probe_covers_reasoning_gym(compose, task):
    cfg = validate(compose(*GYM, f"prompts.task={task}"))
    splits, verifier = preflight(cfg)  # probes: references score 1, nothing refused
    try:
        assert check_verifier_reads_prompts(cfg, splits, verifier) is None
    finally:
        verifier.close()
    # a verifier that cannot read the entry's reference is refused, naming the fix
    with pytest.raises(ConfigError, match="cannot score this prompt set.*e.g. verifier=reasoning_gym"):
        check_verifier_reads_prompts(cfg, splits, build_verifier({"name": "exact_match"}))
