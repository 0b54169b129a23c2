"""The lab task (`prompts=chain`, rlcompare/data/chain_task.py): its forms, its splits, its verifier and its config.

Every expected string and number below is worked by hand from the prompt 3+8+5+1=."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rlcompare.data import chain_task as ct
from rlcompare import models
from rlcompare.config import ConfigError, validate
from rlcompare.data.prompts import build_prompts
from rlcompare.rewards.verifiers import build_verifier

TERMS = [3, 8, 5, 1]  # running sums 11, 16, 17


def test_the_three_forms_of_a_sum():
    assert ct.partial_sums(TERMS) == [11, 16, 17]
    assert ct.chain_prompt(TERMS) == "3+8+5+1="
    assert ct.write_form(TERMS, "answer") == "17"
    assert ct.write_form(TERMS, "sums") == "11\n16\n17"
    assert ct.write_form(TERMS, "steps") == "3+8=11\n11+5=16\n16+1=17"


def test_a_slip_propagates_to_every_later_sum():
    # step 1 (11+5) off by 2: 18, then 18+1 = 19
    assert ct.write_form(TERMS, "steps", slip=(1, 2)) == "3+8=11\n11+5=18\n18+1=19"
    assert ct.write_form(TERMS, "sums", slip=(0, 1)) == "12\n17\n18"
    assert ct.write_form(TERMS, "answer", slip=(2, 1)) == "18"
    with pytest.raises(ValueError, match="unknown chain form"):
        ct.write_form(TERMS, "essay")


def test_the_verifier_reads_the_last_line_of_every_form():
    v = build_verifier({"name": "exact_match", "number": "last"})
    for form in ct.FORMS:
        assert v.score(ct.write_form(TERMS, form), "17").correct, form
        assert not v.score(ct.write_form(TERMS, form, slip=(1, 1)), "17").correct, form
    # the default exact_match (first number) would read 11 off the running sums: why prompts=chain picks last_number
    assert not build_verifier({"name": "exact_match"}).score("11\n16\n17", "17").correct
    # a false last step is not rescued by its right-hand side being the answer
    assert not v.score("3+8=11\n11+5=16\n16+2=17", "17").correct


def test_warm_start_targets_follow_the_form_weights_and_the_slip_rate():
    rng = random.Random(0)
    outs = [ct.sft_target(TERMS, rng, {"answer": 0.5, "sums": 0.0, "steps": 0.5}, 0.25, (1, 2)) for _ in range(4000)]
    forms = Counter("steps" if "+" in o else "sums" if "\n" in o else "answer" for o in outs)
    assert forms["sums"] == 0 and abs(forms["answer"] / 4000 - 0.5) < 0.03
    wrong = sum(not o.endswith("17") or o.endswith("=117") for o in outs) / 4000
    assert abs(wrong - 0.25) < 0.03
    assert all(o.split("\n")[-1].split("=")[-1] in {"17", "18", "19"} for o in outs)  # slips are upward, +1 or +2


def test_terms_are_read_back_from_a_templated_prompt():
    assert ct.terms_of("Add them up: 3+8+5+1=") == TERMS
    with pytest.raises(ValueError, match="not a chain prompt"):
        ct.terms_of("17+")


def test_splits_are_deterministic_balanced_and_held_out():
    kw = dict(n_train=3000, n_eval=100, min_terms=2, max_terms=6, max_term=9)
    train, ev = ct.chain_lists(data_seed=0, **kw)
    assert (train, ev) == ct.chain_lists(data_seed=0, **kw)
    assert ct.chain_lists(data_seed=1, **kw)[1] != ev
    assert Counter(len(e) for e in ev) == {k: 20 for k in range(2, 7)}
    assert len(set(ev)) == 100 and not set(ev) & set(train)
    assert all(1 <= t <= 9 for e in train + ev for t in e)


def test_bad_chain_settings_name_the_key():
    with pytest.raises(ValueError, match=r"prompts.min_terms=5 / prompts.max_terms=3"):
        ct.chain_lists(data_seed=0, n_train=10, n_eval=10, min_terms=5, max_terms=3, max_term=9)
    with pytest.raises(ValueError, match=r"prompts.max_term=12"):
        ct.chain_lists(data_seed=0, n_train=10, n_eval=10, min_terms=2, max_terms=3, max_term=12)
    with pytest.raises(ValueError, match=r"prompts.n_eval=200 holds out more than half of the 81 lists of 2 terms"):
        ct.chain_lists(data_seed=0, n_train=10, n_eval=200, min_terms=2, max_terms=2, max_term=9)


def test_prompts_chain_picks_its_budget_and_verifier_and_the_command_line_still_wins(compose):
    cfg = validate(compose("prompts=chain", fast=False))
    assert (cfg.prompts.kind, cfg.budget.name, cfg.budget.max_new_tokens, cfg.verifier.number) == (
        "chain",
        "lab",
        48,
        "last",
    )
    assert compose("prompts=chain", "budget=tiny", fast=False).budget.name == "tiny"
    default = compose(fast=False)
    assert (default.budget.name, default.verifier.get("number", "first")) == ("smoke", "first")


def test_the_chain_prompt_set_and_its_warm_start_table(compose):
    cfg = validate(compose("prompts=chain", fast=False))
    splits = build_prompts(cfg.prompts)
    assert len(splits.train) == 20000 and len(splits.eval) == 200
    assert splits.eval[0].prompt.endswith("=") and splits.eval[0].answer == str(sum(splits.eval[0].meta["terms"]))
    table = models.warm_start_table(splits, cfg.prompts)
    assert len(table) == 20000  # train only, repeats kept
    assert not {p for p, _ in table} & {ex.prompt for ex in splits.eval}
    recipe = models.warm_start_recipe(cfg.model, cfg.prompts)
    assert recipe["steps"] == 2500 and recipe["batch_size"] == cfg.model.warm_start.batch_size  # replaced / kept


def test_a_generated_chain_set_is_bounded_before_anything_is_built(compose):
    with pytest.raises(ConfigError, match=r"prompts.n_train=2000000 must be <= 1000000"):
        validate(compose("prompts=chain", "prompts.n_train=2000000", fast=False))
