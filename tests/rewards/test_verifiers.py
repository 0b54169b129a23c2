"""Verifiers: known-equivalent / known-different pairs, the Countdown parser, and hostile completions
(each must come back in bounded time, without raising, from every verifier)."""

import math
import os
import signal
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlcompare.rewards import countdown_expr as ce  # noqa: E402
from rlcompare.config import VerifierConfig  # noqa: E402
from rlcompare.rewards.verifiers import (  # noqa: E402
    ExactMatch,
    Score,
    build_verifier,
    last_boxed,
    normalize_number,
    score_batch,
)

ROOT = Path(__file__).resolve().parents[2]
CD = ce.encode_countdown([3, 5, 7], 22)


def ok(v, completion, answer):
    s = v.score(completion, answer)
    assert not s.error
    return s.correct


# ---------------------------------------------------------------- exact_match
@pytest.mark.parametrize(
    "a, b", [("1,000", "1000"), ("1000.0", "1000"), ("+1000", "1000"), ("-0.50", "-0.5"), ("007", "7"), ("-0", "0")]
)
def test_normalize_number_equivalents(a, b):
    assert normalize_number(a) == normalize_number(b) is not None


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "１２３", "١٢٣", "1e5", "", "12a", "1" * 101])
def test_normalize_number_refuses_non_plain_numbers(text):
    assert normalize_number(text) is None


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("17", "17", True),  # the embedded arithmetic task
        ("17 and then 5", "17", False),  # two numbers on the answer line: no single value (was True)
        ("17\nand then 5", "17", True),  # plain completions: the first line holding a digit
        ("1,000", "1000", True),
        ("1000.0", "1,000", True),
        ("+1000", "1000", True),
        ("18", "17", False),
        ("", "17", False),
        ("The sum is 5, so 2+3 = <answer>5</answer>", "5", True),  # <answer> beats the first number
        ("<answer>3 + 4 = 7</answer>", "7", True),  # inside a marker: a true equation
        ("so the answer is \\boxed{1,024}.", "1024", True),
        ("x = 2, y = 3\n#### 42", "42", True),
        ("#### 41", "42", False),
        ("１２３", "123", False),  # ASCII digits only
        ("٣", "3", False),
        ("<answer>A</answer>", "A", True),  # non-numeric reference: text match
        ("<answer>B</answer>", "A", False),
    ],
)
def test_exact_match_pairs(completion, answer, expected):
    assert ok(ExactMatch(), completion, answer) is expected


def test_exact_match_last_number_option():
    v = build_verifier({"name": "exact_match", "number": "last"})
    assert ok(v, "3 + 4 = 7", "7") and not ok(v, "7 minus 4 is 3", "7")


def test_exact_match_batch_is_scored_inline_without_worker_processes():
    # linear-time by construction, so no worker pool and no inter-process round trip per batch
    v = build_verifier(OmegaConf.create({"name": "exact_match", "timeout_s": 2.0}))
    comps, answers = [str(i % 37) for i in range(128)], [str(i % 41) for i in range(128)]
    out = score_batch(v, comps, answers, timeout_s=2.0)
    assert v.bounded and getattr(v, "_pool", None) is None
    assert [s.correct for s in out] == [c == a for c, a in zip(comps, answers)]


def test_last_boxed_keeps_nested_braces():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{\\sqrt{2}}{2}} end") == "\\frac{\\sqrt{2}}{2}"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\boxed{unbalanced") is None and last_boxed("nothing") is None


# ---------------------------------------------------------------- math_verify
@pytest.fixture(scope="module")
def mv():
    v = build_verifier({"name": "math_verify", "timeout_s": 2.0, "workers": 1})
    score_batch(v, ["1"], ["1"], timeout_s=5.0)  # start the worker outside the timed checks
    yield v
    v.close()


MATH_PAIRS = [
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("The answer is $\\frac{1}{2}$.", "0.5", True),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", True),
    ("<answer>\\frac{\\sqrt{2}}{2}</answer>", "\\sqrt{2}/2", True),
    ("<answer>42</answer>", "42", True),
    ("so \\boxed{5\\sqrt{2}}", "\\sqrt{50}", True),
    ("\\boxed{(-2, 2)}", "(-2,2)", True),
    ("\\boxed{3}", "2", False),
    ("\\boxed{\\frac{1}{3}}", "0.5", False),
    ("\\boxed{x+1}", "x+2", False),
]


@pytest.mark.parametrize("completion, answer, expected", MATH_PAIRS)
def test_math_verify_pairs_inline(completion, answer, expected):
    v = build_verifier({"name": "math_verify"})  # called directly in the main thread: math-verify's own timeouts
    assert ok(v, completion, answer) is expected


def test_math_verify_pairs_in_workers(mv):
    out = score_batch(mv, [c for c, _, _ in MATH_PAIRS], [a for _, a, _ in MATH_PAIRS], timeout_s=5.0)
    assert [s.correct for s in out] == [e for _, _, e in MATH_PAIRS]
    assert not any(s.error for s in out)


def test_math_verify_unparseable_reference_is_an_error(mv):
    assert score_batch(mv, ["\\boxed{1}"], [""], timeout_s=2.0) == [Score(0.0, False, True)]


# ---------------------------------------------------------------- countdown
@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>3*5+7</answer>", True),
        ("<answer> 3 * 5 + 7 </answer>", True),
        ("<think>try 3*5=15, 15+7</think>\n<answer>(3 * 5) + 7 = 22</answer>", True),
        ("I think it is\n3 × 5 + 7", True),  # last line, × accepted
        ("7 + 3 × 5 = 22.", True),
        ("$22 = 7 + 5 \\times 3$", True),
        ("<answer>3*5+7+7</answer>", False),  # 7 used twice
        ("<answer>3**5</answer>", False),  # power refused
        ("<answer>(3+5)*7</answer>", False),  # 56
        ("<answer>22</answer>", False),  # 22 is not a given number
        ("<answer>-3+25</answer>", False),  # unary minus refused; 25 not given
        ("<answer>3*5+7.0</answer>", False),  # decimals refused
        ("no numbers here", False),
    ],
)
def test_countdown_pairs(completion, expected):
    assert ok(build_verifier({"name": "countdown"}), completion, CD) is expected


def test_countdown_require_all_and_duplicates():
    at_most = build_verifier({"name": "countdown"})
    exactly = build_verifier({"name": "countdown", "require_all": True})
    ref = ce.encode_countdown([2, 3, 4, 10], 10)
    assert ok(at_most, "<answer>10</answer>", ref) and not ok(exactly, "<answer>10</answer>", ref)
    assert ok(exactly, "<answer>(2*3-4)*10</answer>", ce.encode_countdown([2, 3, 4, 10], 20))
    dup = ce.encode_countdown([5, 5, 2], 12)
    assert ok(at_most, "<answer>5+5+2</answer>", dup)
    assert not ok(at_most, "<answer>5+5+5-3</answer>", dup)


def test_countdown_exact_fractions():
    ref = ce.encode_countdown([1, 3, 9], 3)
    assert ok(build_verifier({"name": "countdown"}), "<answer>(1/3)*9</answer>", ref)  # exact, no float error
    assert ok(build_verifier({"name": "countdown"}), "<answer>9 ÷ 3 − 1</answer>", ce.encode_countdown([9, 3, 1], 2))


def test_countdown_bad_reference_is_an_error_not_a_crash():
    v = build_verifier({"name": "countdown"})
    with pytest.raises(ValueError, match="nums"):
        v.score("<answer>1+2</answer>", "{}")
    assert (
        score_batch(v, ["<answer>1+2</answer>"] * 2, ["not json", '{"nums": "x", "target": 3}'], timeout_s=1)
        == [Score(0.0, False, True)] * 2
    )


@pytest.mark.parametrize(
    "text, value, numbers",
    [
        ("3*5+7", 22, (3, 5, 7)),
        ("(1+2)*(3+4)", 21, (1, 2, 3, 4)),
        ("10/4", Fraction(5, 2), (10, 4)),
        ("8 - 2 - 1", 5, (8, 2, 1)),  # left associative
        ("8 / 2 / 2", 2, (8, 2, 2)),
        ("\\times".join(["2", "3"]), 6, (2, 3)),
    ],
)
def test_countdown_expr_evaluates(text, value, numbers):
    ev = ce.evaluate(text)
    assert ev.value == value and ev.numbers == numbers


@pytest.mark.parametrize(
    "text, why",
    [
        ("1/0", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("2**3", "power"),
        ("9**9**9**9", "power"),
        ("-3+5", "unary"),
        ("1.5+1", "decimal"),
        ("１+２", "not allowed"),
        ("١+٢", "not allowed"),
        ("__import__('os').system('echo hi')", "not allowed"),
        ("exec('1')", "not allowed"),
        ("nan", "not allowed"),
        ("inf", "not allowed"),
        ("1\x002", "not allowed"),
        ("", "empty"),
        ("(1+2", "unbalanced"),
        ("1+2)", "after the expression"),
        ("1 2", "after the expression"),
        ("1000001", "larger than"),
        ("99999999999999999999999", "larger than"),
        ("1000000*1000000*2", "beyond"),
        ("1/1000000/1000000/7", "beyond"),
        ("(" * 33 + "1" + ")" * 33, "deeper"),
        ("(" * 5000 + "1" + ")" * 5000, "longer"),
        ("1+" * 300 + "1", "longer"),
    ],
)
def test_countdown_expr_refuses(text, why):
    with pytest.raises(ce.ExprError, match=why):
        ce.evaluate(text)


def test_countdown_expr_depth_limit_is_exact():
    assert ce.evaluate("(" * 32 + "1" + ")" * 32).value == 1


# ---------------------------------------------------------------- format and weighted
@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>3*5=15</think> <answer>3*5+7</answer>", True),
        ("3*5=15</think>\n<answer>3*5+7</answer>\n", True),  # the r1 template already opened <think>
        ("<answer>3*5+7</answer>", False),
        ("<think>x</think><answer>1</answer> trailing text", False),
        ("<think>x</think>", False),
        ("", False),
    ],
)
def test_format_default_r1(completion, expected):
    assert ok(build_verifier({"name": "format"}), completion, "") is expected


def test_format_custom_pattern_and_bad_regex():
    v = build_verifier({"name": "format", "pattern": r"\\boxed\{"})
    assert ok(v, "so \\boxed{2}", "") and not ok(v, "2", "")
    assert not v.bounded  # a custom regex runs in a worker under score_batch
    with pytest.raises(ValueError, match="verifier.pattern"):
        build_verifier({"name": "format", "pattern": "("})


def test_weighted_sums_and_reports_first_correct():
    v = build_verifier(OmegaConf.load(ROOT / "conf/verifier/weighted.yaml"))
    both = v.score("<think>15+7</think><answer>3*5+7</answer>", CD)
    assert both.reward == pytest.approx(1.1) and both.correct
    fmt_only = v.score("<think>?</think><answer>3*5</answer>", CD)
    assert fmt_only.reward == pytest.approx(0.1) and not fmt_only.correct
    right_no_format = v.score("3*5+7", CD)
    assert right_no_format.reward == pytest.approx(1.0) and right_no_format.correct


def test_weighted_components_inherit_and_override_settings():
    v = build_verifier(
        {
            "name": "weighted",
            "require_all": True,
            "components": [
                {"name": "countdown", "weight": 2.0},
                {"name": "countdown", "weight": 1.0, "require_all": False},
            ],
        }
    )
    s = v.score("<answer>3*5</answer>", ce.encode_countdown([3, 5, 7], 15))
    assert s.reward == pytest.approx(1.0) and not s.correct


# ---------------------------------------------------------------- building
def test_unknown_verifier_names_the_key_and_the_choices():
    with pytest.raises(
        ValueError, match=r"verifier.name='nope'.*exact_match, math_verify, countdown, format, weighted"
    ):
        build_verifier({"name": "nope"})
    with pytest.raises(ValueError, match=r"verifier.components\[1\].name='bogus'"):
        build_verifier({"name": "weighted", "components": [{"name": "format"}, {"name": "bogus"}]})
    with pytest.raises(ValueError, match="verifier.components"):
        build_verifier({"name": "weighted"})
    with pytest.raises(ValueError, match="verifier.isolation"):
        build_verifier({"name": "format", "isolation": "thread"})
    with pytest.raises(ValueError, match="verifier.number"):
        build_verifier({"name": "exact_match", "number": "middle"})


@pytest.mark.parametrize("name", ["exact_match", "math_verify", "countdown", "format", "weighted"])
def test_conf_files_fit_the_schema_and_build(name):
    schema = OmegaConf.structured(VerifierConfig)
    OmegaConf.set_struct(schema, False)  # a verifier's own settings are declared at its registration (registry.py)
    cfg = OmegaConf.merge(schema, OmegaConf.load(ROOT / f"conf/verifier/{name}.yaml"))
    v = build_verifier(cfg)
    assert v.name == name and cfg.name == name


def test_score_batch_length_mismatch_is_a_bug():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        score_batch(ExactMatch(), ["1", "2"], ["1"])
    assert score_batch(ExactMatch(), [], []) == []


def test_score_batch_turns_exceptions_into_errors():
    class Boom:
        bounded = True

        def score(self, c, a):
            raise RuntimeError("boom")

    assert score_batch(Boom(), ["1"], ["1"]) == [Score(0.0, False, True)]


# ---------------------------------------------------------------- hostile completions
HOSTILE = {
    "injection": "__import__('os').system('echo hi')",
    "exec": "exec(\"import os; os.system('echo hi')\")",
    "tower": "9**9**9**9",
    "tower_answer": "<answer>9**9**9**9</answer>",
    "latex_tower": "\\boxed{9^{9^{9^{9}}}}",
    "factorials": "\\boxed{10!!!!}",
    "huge": "7" * 10_000_000,
    "huge_text": "x" * 10_000_000,
    "nested": "(" * 5000 + "1" + ")" * 5000,
    "nested_answer": "<answer>" + "(" * 5000 + "3" + ")" * 5000 + "</answer>",
    "arabic": "١٢٣",
    "fullwidth": "１２３",
    "nan": "nan",
    "inf": "inf",
    "neg_inf": "-inf",
    "boxed_inf": "\\boxed{\\infty}",
    "div0": "1/0",
    "div0_answer": "<answer>(3+5)/(7-7)</answer>",
    "div0_latex": "\\boxed{\\frac{1}{0}}",
    "empty": "",
    "nul": "\x00" * 1000,
    "nul_mixed": "<answer>3\x00*5+7</answer>",
    "many_tags": "<answer>" * 100_000 + "</think>" * 1000,
    "many_boxed": "\\boxed{" * 50_000,
}
NAMES = ["exact_match", "math_verify", "countdown", "format", "weighted"]
TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def verifiers(mv):
    vs = {
        n: build_verifier(
            {
                "name": n,
                "timeout_s": TIMEOUT_S,
                "workers": 1,
                **(
                    {"components": [{"name": "countdown", "weight": 1.0}, {"name": "format", "weight": 0.1}]}
                    if n == "weighted"
                    else {}
                ),
            }
        )
        for n in NAMES
        if n != "math_verify"
    }
    vs["math_verify"] = mv
    return vs


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_completions_are_bounded(verifiers, name, case):
    v = verifiers[name]
    answer = CD if name in ("countdown", "weighted") else "123"
    score_batch(v, ["1"], [answer], timeout_s=5.0)  # a worker killed by the previous case restarts here, untimed
    t0 = time.perf_counter()
    (s,) = score_batch(v, [HOSTILE[case]], [answer], timeout_s=TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    assert elapsed < TIMEOUT_S + 1.0, f"{name} took {elapsed:.2f}s on {case}"
    assert isinstance(s, Score) and math.isfinite(s.reward) and s.reward == 0.0 and not s.correct


def test_hostile_batch_of_everything(mv):
    comps = list(HOSTILE.values()) + ["\\boxed{123}"]
    t0 = time.perf_counter()
    out = score_batch(mv, comps, ["123"] * len(comps), timeout_s=TIMEOUT_S)
    assert time.perf_counter() - t0 < len(comps) * (TIMEOUT_S + 1.0)
    assert [s.correct for s in out] == [False] * len(HOSTILE) + [True]


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX signals")
def test_stuck_worker_is_killed_and_replaced():
    # A worker that does not answer (stuck in C code where SIGALRM cannot reach; simulated with SIGSTOP)
    # is killed at timeout_s + 0.5 s; the item scores as an error and a fresh worker takes over.
    v = build_verifier({"name": "format", "pattern": r"^(a+)+b$", "workers": 1})
    assert score_batch(v, ["aab"], [""], timeout_s=5.0) == [Score(1.0, True, False)]
    pid = v._pool.workers[0].proc.pid
    os.kill(pid, signal.SIGSTOP)
    t0 = time.perf_counter()
    (s,) = score_batch(v, ["aab"], [""], timeout_s=0.3)
    assert time.perf_counter() - t0 < 0.3 + 1.0
    assert s == Score(0.0, False, True)
    assert score_batch(v, ["aab", "ac"], ["", ""], timeout_s=2.0) == [Score(1.0, True, False), Score(0.0, False, False)]
    assert v._pool.workers[0].proc.pid != pid
    os.kill(v._pool.workers[0].proc.pid, signal.SIGKILL)  # a worker that died between calls is replaced, no error
    time.sleep(0.1)
    assert score_batch(v, ["aab"], [""], timeout_s=2.0) == [Score(1.0, True, False)]
    v.close()
