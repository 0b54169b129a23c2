"""A verifier that cannot score the prompt set is refused before training (issue 18): a few of the set's own
reference answers, written as correct completions in its template's form, must score correct, and surely wrong
ones wrong, or the run stops naming prompts= and verifier= before any warm start or model load."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlcompare.config import ConfigError, validate
from rlcompare.rewards.countdown_expr import evaluate
from rlcompare.data.datasets import TEMPLATES
from rlcompare.data.prompts import Example, PromptSplits
from rlcompare.train.run import preflight, train
from rlcompare.train.verifier_probe import N_PROBES, check_verifier_reads_prompts, completions_for, solve_countdown
from rlcompare.rewards.verifiers import build_verifier

GSM8K_FILE = [
    "prompts=gsm8k",
    "prompts.kind=file",
    "prompts.path=tests/data/gsm8k_sample.jsonl",
    "prompts.eval_fraction=0.3",
]
MATH_FILE = [
    "prompts=math",
    "prompts.kind=file",
    "prompts.path=tests/data/math_sample.jsonl",
    "prompts.eval_fraction=0.3",
]


@pytest.fixture
def no_heavy_work(monkeypatch):
    from rlcompare.models import load as models
    from rlcompare.train import trainer

    def heavy(*a, **k):
        raise AssertionError("warm start or model load before the verifier was probed")

    monkeypatch.setattr(trainer.Trainer, "__init__", heavy)
    monkeypatch.setattr(trainer, "load_policy", heavy)
    monkeypatch.setattr(models, "warm_start_tiny", heavy)


# ----------------------------------------------------------------------------- the completions written
def test_completions_take_the_form_each_template_asks_for():
    # the base-model R1 template ends inside "<think>": the completion closes it
    assert completions_for(TEMPLATES["r1"], "8") == (" I work it out. </think> <answer>8</answer>",)
    # the chat R1 template asks for both tags
    assert completions_for(TEMPLATES["r1_chat"], "8") == ("<think> I work it out. </think> <answer>8</answer>",)
    assert completions_for(TEMPLATES["boxed"], "8") == ("I work it out. The final answer is \\boxed{8}.",)
    # a template that asks for no form: the bare answer, in $...$ and boxed
    assert completions_for("{question}", "17") == ("17", "$17$", "\\boxed{17}")


@pytest.mark.parametrize(
    "nums,target,require_all",
    [
        ([3, 5, 7], 22, False),  # 3*5+7
        ([3, 5, 7], 22, True),
        ([1, 2, 3, 4], 24, True),  # 1*2*3*4
        ([10, 7, 1], 10, False),  # a subset (the 10 alone) is allowed when not every number must be used
        ([8, 3, 8, 3], 24, True),  # 8/(3-8/3): needs a fraction on the way
    ],
)
def test_countdown_solutions_reach_the_target_with_the_given_numbers(nums, target, require_all):
    expr = solve_countdown(nums, target, require_all)
    ev = evaluate(expr)
    assert ev.value == Fraction(target)
    used = sorted(ev.numbers)
    assert used == sorted(nums) if require_all else all(used.count(n) <= nums.count(n) for n in used)


def test_countdown_search_gives_up_on_no_solution_and_on_many_numbers():
    assert solve_countdown([1, 1], 100) is None  # at most 2
    assert solve_countdown([6, 4], 3) is None  # 10, 2, -2, 24, 3/2, 2/3, 6 and 4: no 3
    assert solve_countdown([1, 2, 3, 4, 5], 15) is None  # more numbers than the search tries


# ----------------------------------------------------------------------------- mismatches refused
@pytest.mark.parametrize(
    "overrides,names,why",
    [
        # errors on every call (the arithmetic reference is not Countdown JSON): trained on zero reward
        (
            ["verifier=countdown"],
            "prompts=arithmetic verifier=countdown",
            r"8 of 8 correct answers .* the verifier raised",
        ),
        # can never give reward 1 (reads a number, the reference is JSON), and started a 300-step warm start first
        (
            ["prompts=countdown", "verifier=exact_match"],
            "prompts=countdown verifier=exact_match",
            r"8 of 8 correct answers .* scored wrong",
        ),
        # the Countdown verifier reads <answer> or the last line, not the \boxed{} this template asks for
        (
            ["prompts=countdown", "prompts.template=boxed", "verifier=countdown"],
            "prompts=countdown verifier=countdown",
            r"8 of 8 correct answers .*\\\\boxed\{",
        ),
        # math-verify reads the target out of the Countdown JSON: a bare '22' scored correct without using the numbers
        (
            ["prompts=countdown", "verifier=math_verify"],
            "prompts=countdown verifier=math_verify",
            r"8 of 8 surely wrong answers .* scored correct \(e\.g\. completion ' I work it out\. </think> <answer>22</answer>'",
        ),
        (GSM8K_FILE + ["verifier=countdown"], "prompts=gsm8k verifier=countdown", r"correct answers .* scored wrong"),
    ],
)
@pytest.mark.slow
def test_a_verifier_that_cannot_score_the_prompt_set_is_refused_before_the_model_loads(
    compose, tmp_path, no_heavy_work, overrides, names, why
):
    with pytest.raises(ConfigError) as e:
        train(compose(*overrides))
    msg = str(e.value)
    assert msg.startswith(f"{names}: the verifier cannot score this prompt set: ")
    assert __import__("re").search(why, msg), msg
    assert "verifier.probe=false" in msg and "\n" not in msg
    assert not (tmp_path / "results").exists()  # refused before the run folder was made


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["verifier=math_verify"],
        ["prompts=countdown", "verifier=countdown"],
        ["prompts=countdown", "verifier=weighted"],
        ["prompts=countdown_file", "verifier=countdown"],
        ["prompts=countdown_file", "verifier=countdown", "verifier.require_all=true"],
        GSM8K_FILE,
        GSM8K_FILE + ["verifier=math_verify"],
        GSM8K_FILE + ["prompts.template=r1"],
        GSM8K_FILE + ["prompts.template=r1_chat", "verifier=math_verify"],
        GSM8K_FILE + ["prompts.template=plain"],
        MATH_FILE + ["verifier=math_verify"],
        MATH_FILE + ["prompts.template=plain", "verifier=math_verify"],
    ],
    ids=lambda o: " ".join(x for x in o if "path" not in x and "fraction" not in x and "kind" not in x) or "default",
)
@pytest.mark.slow
def test_matching_prompt_sets_and_verifiers_pass(compose, overrides):
    splits, verifier = preflight(validate(compose(*overrides)))
    verifier.close()
    assert splits.train and splits.eval


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_format_is_not_probed_and_probe_false_turns_the_probe_off(compose):
    # format's `correct` ignores the reference: it reads no answer, so there is nothing to probe
    for overrides in (
        ["verifier=format"],
        ["prompts=countdown", "verifier=format"],
        ["verifier=countdown", "verifier.probe=false"],
    ):
        preflight(validate(compose(*overrides)))


def test_the_probe_flag_is_not_part_of_the_fingerprint(compose):
    """Runs made before the key existed (and with the probe off) compare with runs made with it."""
    from types import SimpleNamespace

    from rlcompare.data.prompts import arithmetic_splits
    from rlcompare.train.run import fingerprint

    splits = arithmetic_splits(data_seed=0, n_train=10, n_eval=4, max_operand=3)
    tr = SimpleNamespace(
        train_prompts=splits.train,
        eval_prompts=splits.eval,
        splits=splits,
        policy=SimpleNamespace(init_hash="h", warm_start_key="k", source="tiny"),
    )
    on, off = (fingerprint(validate(compose(*o)), tr) for o in ([], ["verifier.probe=false"]))
    assert on == off and "probe" not in on["verifier"] and on["verifier"]["name"] == "exact_match"


# ----------------------------------------------------------------------------- a few unreadable references
def _splits(answers: list[str]) -> PromptSplits:
    examples = [Example(f"q{i}=", a) for i, a in enumerate(answers)]
    return PromptSplits(train=examples, eval=examples[:N_PROBES])


def test_few_unreadable_references_warn_and_many_refuse(compose):
    """exact_match with max_chars=3 reads the first 3 characters: a 6-digit reference can never score correct."""
    cfg = validate(compose("+verifier.max_chars=3"))
    verifier = build_verifier(cfg.verifier)
    one_long = ["17", "123456", "5", "8", "12", "30", "9", "11"]
    warning = check_verifier_reads_prompts(cfg, _splits(one_long), verifier)
    assert warning.startswith("prompts=arithmetic verifier=exact_match: warning: 1 of 8 correct answers")
    assert "'123456'" in warning
    half_long = ["123456", "17", "234567", "5", "345678", "8", "456789", "12"]
    with pytest.raises(
        ConfigError,
        match=r"^prompts=arithmetic verifier=exact_match: the verifier cannot score this "
        r"prompt set: 4 of 8 correct answers",
    ):
        check_verifier_reads_prompts(cfg, _splits(half_long), verifier)
    assert check_verifier_reads_prompts(cfg, _splits(["1", "2", "3", "4", "5", "6", "7", "8"]), verifier) is None
