"""Verifier audit: more hostile completions (beyond tests/rewards/test_verifiers.py), and one test per bug the audit fixed.

Every expected value below is worked out by hand from the verifier's documented rule, not copied from output.
"""

import math
import signal
import time

import pytest

from rlcompare.rewards import countdown_expr as ce
from rlcompare.rewards.verifiers import (
    ExactMatch,
    Score,
    build_verifier,
    last_tag,
    normalize_number,
    score_batch,
)

CD = ce.encode_countdown([3, 5, 7], 22)


def correct(v, completion, answer):
    s = v.score(completion, answer)
    assert not s.error
    return s.correct


# ---------------------------------------------------------------- exact_match: fixes
@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        # U+2212 MINUS SIGN is a minus: '−5' is -5 (it used to read as 5, i.e. right against 5, wrong against -5)
        ("<answer>−5</answer>", "5", False),
        ("<answer>−5</answer>", "-5", True),
        ("−5", "-5", True),  # plain completion: first number
        ("\\boxed{-5}", "−5", True),  # a reference written with U+2212
        ("−0", "0", True),
        # commas are thousands separators only (groups of 3): a list is not one number
        ("the roots are 1,2,3", "123", False),  # a list: three numbers, no single value
        ("<answer>1,2,3</answer>", "123", False),  # marker: a list, no single value
        ("<answer>1,2,3</answer>", "3", False),  # a list of three candidates (was True: its last number)
        ("<answer>12,34</answer>", "1234", False),
        ("<answer>1,000,000</answer>", "1000000", True),
        ("1,000.5 dollars", "1000.5", True),
        ("so 1,0000", "10000", False),  # a malformed group: the first number is 1
        # a leading decimal point: '.5' is 0.5 (it used to read as 5)
        ("<answer>.5</answer>", "5", False),
        ("<answer>.5</answer>", "0.5", True),
        ("-.25", "-0.25", True),
        # nested answer tags: the innermost content
        ("<answer><answer>7</answer></answer>", "7", True),
    ],
)
def test_exact_match_audit_pairs(completion, answer, expected):
    assert correct(ExactMatch(), completion, answer) is expected


@pytest.mark.parametrize(
    "a, b", [("−5", "-5"), ("1,000,000", "1000000"), (".5", "0.5"), ("-.50", "-0.5"), ("1,000.0", "1000")]
)
def test_normalize_number_audit_equivalents(a, b):
    assert normalize_number(a) == normalize_number(b) is not None


@pytest.mark.parametrize("text", ["1,2,3", "12,34", "1,0000", "1000,000", "10,00,000", "1.", ".", "-", "−"])
def test_normalize_number_audit_refuses(text):
    assert normalize_number(text) is None


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("1e3", "1000", False),  # scientific notation is not read (documented: plain decimals only)
        ("0x10", "16", False),
        ("1_000", "1000", False),
        ("1 000", "1000", False),
        ("1000.", "1000", True),
        ("$1,000", "1000", True),
        ("+1,000.00", "1000", True),
        ("١٠٠٠", "1000", False),  # Arabic-Indic digits
        ("１０００", "1000", False),  # full-width digits
        ("1\u200b000", "1000", False),  # a zero-width space splits the number: first number 1
    ],
)
def test_exact_match_other_normalization_edges(completion, answer, expected):
    assert correct(ExactMatch(), completion, answer) is expected


def test_last_tag_innermost_and_last():
    assert last_tag("<answer><answer>5</answer></answer>") == "5"
    assert last_tag("<answer>a</answer> <answer>b</answer>") == "b"
    assert last_tag("<answer>a</answer><answer>") == "a"  # an unclosed open after the last close is ignored
    assert last_tag("</answer><answer>") is None and last_tag("no tags") is None


# ---------------------------------------------------------------- countdown: fixes and edges
@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>3*5+7 = 23</answer>", False),  # a false equation (3*5+7 is 22) used to score 1
        ("<answer>3*5+7 = 3*5+8</answer>", False),
        ("<answer>3*5+7 = 15+7 = 22</answer>", True),  # a true chain
        ("<answer>22 = 3*5+7</answer>", True),
        ("<answer>3*5+7 = 22 (done)</answer>", False),  # a side that is not an expression
        ("<answer><answer>3*5+7</answer></answer>", True),  # nested tags: the innermost
        ("<answer>5--5</answer>", False),
        ("<answer>2(3)</answer>", False),  # implicit multiplication refused
        ("<answer>3⋅5+7</answer>", True),
        ("<answer>3*5+７</answer>", False),  # full-width 7 refused
        ("<answer>\u200b3*5+7</answer>", False),  # zero-width space refused
        ("<answer>3*5+7\ud800</answer>", False),  # lone surrogate refused
        ("<answer>" + "(" * 100_000 + "</answer>", False),
    ],
)
def test_countdown_audit_pairs(completion, expected):
    assert correct(build_verifier({"name": "countdown"}), completion, CD) is expected


def test_countdown_many_equals_signs_stay_cheap():
    v = build_verifier({"name": "countdown"})
    t0 = time.perf_counter()
    assert correct(v, "<answer>3*5+7" + "=22" * 2000 + "</answer>", CD)  # 2001 sides, all 22 (6022 chars)
    assert not correct(v, "<answer>3*5+7" + "=22" * 1999 + "=21</answer>", CD)
    assert time.perf_counter() - t0 < 3.0  # a bound against runaway cost (measured: milliseconds), not a speed test


def test_countdown_hostile_references_are_errors_not_crashes():
    v = build_verifier({"name": "countdown"})
    refs = [
        '{"nums": [3, 5, 7], "target": ' + "9" * 5000 + "}",  # int() digit limit -> ValueError
        "[" * 100_000,  # json RecursionError
        '{"nums": [3, 5, 7], "target": NaN}',
        '{"nums": [3, 5, 7], "target": 22.0}',
        "null",
    ]
    out = score_batch(v, ["<answer>3*5+7</answer>"] * len(refs), refs, timeout_s=1.0)
    assert out == [Score(0.0, False, True)] * len(refs)


# ---------------------------------------------------------------- format: linear default pattern
def test_r1_format_leading_whitespace_is_linear():
    # The former pattern backtracked O(n^2) on n leading blanks: ~1 s at 10_000 and ~15 s at 40_000 characters,
    # inline (format is a 'bounded' verifier, so score_batch gives it no timeout).
    v = build_verifier({"name": "format", "max_chars": 40_000})
    t0 = time.perf_counter()
    assert not correct(v, "\n" * 40_000, "")
    assert not correct(v, " " * 39_000 + "</think>" + " " * 900, "")
    assert correct(v, " \n" * 19_000 + "<think>a</think> <answer>b</answer>", "")
    assert correct(v, "\t" * 39_000 + "a</think><answer>b</answer>\n", "")
    assert time.perf_counter() - t0 < 5.0  # quadratic took ~15 s here; linear takes milliseconds


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("  <think>x</think><answer>1</answer>", True),
        ("<think><think>x</think><answer>1</answer>", True),
        ("x</think>y</think><answer>1</answer>", False),  # text between </think> and <answer>
        ("<think>x</think><answer>1</answer></answer>", False),
        ("<think>x</think>\n\n<answer>\n1\n</answer>\n\n", True),
    ],
)
def test_r1_format_same_language(completion, expected):
    assert correct(build_verifier({"name": "format"}), completion, "") is expected


def test_default_weighted_batch_of_blank_completions_is_fast():
    v = build_verifier(
        {"name": "weighted", "components": [{"name": "countdown", "weight": 1.0}, {"name": "format", "weight": 0.1}]}
    )
    t0 = time.perf_counter()
    out = score_batch(v, [" \n" * 5000] * 16, [CD] * 16, timeout_s=0.5)
    assert time.perf_counter() - t0 < 5.0  # inline: 16 items used to take ~15 s; now milliseconds
    assert out == [Score(0.0, False, False)] * 16


# ---------------------------------------------------------------- math_verify: one deadline inline, timeouts counted
SLOW = "\\boxed{10^{10^{10^{10}}}}"  # math-verify/sympy grind on this far past any timeout


def test_math_verify_inline_call_has_one_deadline_and_counts_the_timeout():
    v = build_verifier({"name": "math_verify", "timeout_s": 0.5})
    v.warm()  # math-verify's and sympy's imports outside the deadline (a first parse on a loaded host took > 0.5 s)
    assert v.score("\\boxed{1}", "1") == Score(1.0, True, False)
    t0 = time.perf_counter()
    s = v.score(SLOW, "1")
    assert time.perf_counter() - t0 < 2.5  # one 0.5 s deadline (before: up to 6 one-second ones)
    assert s == Score(0.0, False, True)  # a timeout is an error (before: reward 0 with error=False)
    assert score_batch(
        build_verifier({"name": "math_verify", "timeout_s": 0.5, "isolation": "inline"}),
        [SLOW, "\\boxed{1}"],
        ["1", "1"],
        timeout_s=0.5,
    ) == [Score(0.0, False, True), Score(1.0, True, False)]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX timers")
def test_math_verify_inline_deadline_gives_back_the_callers_timer():
    fired = []

    def handler(signum, frame):
        fired.append(signum)

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        v = build_verifier({"name": "math_verify", "timeout_s": 0.3})
        assert v.score("\\boxed{2}", "2").correct
        assert v.score(SLOW, "1").error
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < remaining <= 30.0 and not fired  # the caller's timer is back, less the time spent
        assert signal.getsignal(signal.SIGALRM) is handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- new hostile completions, every verifier
BIG = "1" + "0" * 100_000  # past Python's 4300-digit int()/str() limit
HOSTILE = {
    "latex_tower10": "\\boxed{10^{10^{10^{10}}}}",
    "latex_pow_big": "\\boxed{7^{123456789}}",
    "factorial_big": "\\boxed{100000!}",
    "py_pow": "\\boxed{10**100000}",
    "frac_div0": "\\boxed{\\frac{1}{0}}",
    "sqrt_neg": "\\boxed{\\sqrt{-1}}",
    "big_int": BIG,
    "big_int_boxed": "\\boxed{" + "9" * 5000 + "}",
    "big_int_answer": "<answer>" + BIG + "</answer>",
    "exp_float": "<answer>1e999999</answer>",
    "hex_underscore": "<answer>0x10 1_000</answer>",
    "superscripts": "<answer>¹²³</answer>",
    "zero_width": "<answer>1\u200b2\u200b3</answer>",
    "rtl": "\u202e<answer>321</answer>\u202c",
    "nul": "<answer>1\x0023</answer>",
    "surrogate": "<answer>12\ud8003</answer>",
    "bytes_like": "\udcff\udcfe" * 1000,
    "long_line": "a1" * 5_000_000,
    "unbalanced_boxed": "\\boxed{" * 20_000 + "124",
    "nested_tags": "<answer>" * 20_000 + "123" + "</answer>" * 20_000,
    "deep_parens_100k": "<answer>" + "(" * 100_000 + "3" + ")" * 100_000 + "</answer>",
    "blank": " \n" * 5000,
    "many_equals": "<answer>" + "=" * 10_000 + "</answer>",
    "commas": "1," * 50_000,
    "groups": ",".join(["12"] * 30_000),
    "python": "<answer>().__class__.__bases__[0].__subclasses__()</answer>",
    "lambda": "<answer>(lambda: __import__('os').system('id'))()</answer>",
    "nan_inf": "<answer>nan inf -inf 1/0</answer>",
}
NAMES = ["exact_match", "countdown", "format", "weighted", "format_custom"]
TIMEOUT_S = 0.5


def _build(name):
    if name == "format_custom":  # a user regex with catastrophic backtracking: runs in a worker
        return build_verifier({"name": "format", "pattern": r"^(\w+\s?)*$", "workers": 1})
    mix = [{"name": "countdown", "weight": 1.0}, {"name": "format", "weight": 0.1}]
    return build_verifier({"name": name, **({"components": mix} if name == "weighted" else {})})


@pytest.fixture(scope="module")
def verifiers():
    vs = {n: _build(n) for n in NAMES}
    score_batch(vs["format_custom"], ["a"], [""], timeout_s=5.0)  # start its worker outside the timed checks
    yield vs
    vs["format_custom"].close()


@pytest.mark.parametrize("name", NAMES)
def test_new_hostile_completions_are_bounded(verifiers, name):
    v = verifiers[name]
    answer = CD if name in ("countdown", "weighted") else "123"
    for case, text in HOSTILE.items():
        if not v.bounded:  # a worker killed by the previous case restarts here, untimed
            score_batch(v, ["a"], [answer], timeout_s=5.0)
        t0 = time.perf_counter()
        (s,) = score_batch(v, [text], [answer], timeout_s=TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        assert elapsed < TIMEOUT_S + 1.0, f"{name} took {elapsed:.2f}s on {case}"
        assert isinstance(s, Score) and math.isfinite(s.reward)
        if name != "format_custom":  # the custom pattern matches some of them, that is fine
            assert s.reward == 0.0 and not s.correct, case


def test_custom_regex_redos_is_cut_at_the_timeout(verifiers):
    t0 = time.perf_counter()
    out = score_batch(verifiers["format_custom"], ["a" * 40 + "!", "ok fine"], ["", ""], timeout_s=TIMEOUT_S)
    assert time.perf_counter() - t0 < 2 * (TIMEOUT_S + 1.0)
    assert out == [Score(0.0, False, True), Score(1.0, True, False)]


@pytest.mark.slow
def test_math_verify_new_hostile_batch():
    v = build_verifier({"name": "math_verify", "workers": 1})
    try:
        score_batch(v, ["1"], ["1"], timeout_s=30.0)  # start the worker outside the timed part
        comps = list(HOSTILE.values()) + ["\\boxed{123}", "<answer><answer>123</answer></answer>", "\\boxed{1,2,3}"]
        t0 = time.perf_counter()
        out = score_batch(v, comps, ["123"] * len(comps), timeout_s=TIMEOUT_S)
        assert time.perf_counter() - t0 < len(comps) * (TIMEOUT_S + 1.0)
        assert [s.correct for s in out] == [False] * len(HOSTILE) + [True, True, False]
        assert all(math.isfinite(s.reward) for s in out)
        # hostile references: unparseable / slow ones are errors, never a crash
        refs = ["\\boxed{" * 100, "10^{10^{10^{10}}}", "", "\ud800"]
        out = score_batch(v, ["\\boxed{5}"] * len(refs), refs, timeout_s=TIMEOUT_S)
        assert [s.correct for s in out] == [False] * len(refs) and all(s.reward == 0.0 for s in out)
    finally:
        v.close()


# ---------------------------------------------------------------- the worker's replies are read as JSON only
def test_a_worker_reply_that_is_a_pickle_is_not_unpickled(tmp_path):
    """A worker parses model output, so what it sends back is untrusted: a reply that is a pickle (here one that
    creates a file when unpickled) is refused as a lost worker, and the worker is replaced."""
    from rlcompare.rewards.verifiers import WORKER_LOST
    from tests.rewards.hostile_worker import PicklingWorkerVerifier

    marker = tmp_path / "unpickled"
    v = PicklingWorkerVerifier(str(marker))
    try:
        out = score_batch(v, ["a", "b"], ["", ""], timeout_s=30.0, batch_timeout_s=60.0)
    finally:
        v.close()
    assert not marker.exists()  # the parent never unpickled it
    assert out == [WORKER_LOST, WORKER_LOST]  # each item's reply refused; the replaced worker sends another


def test_a_worker_reply_must_be_the_item_s_score():
    from rlcompare.rewards.verifiers import _is_score_reply

    assert _is_score_reply([3, 1.0, True, False, ""], 3)
    assert _is_score_reply([3, 0, False, True, "raised"], 3)
    assert not _is_score_reply([4, 1.0, True, False, ""], 3)  # another item's
    assert not _is_score_reply([3, float("nan"), True, False, ""], 3)
    assert not _is_score_reply([3, "1.0", True, False, ""], 3)
    assert not _is_score_reply([3, 1.0, 1, False, ""], 3)  # correct must be a bool
    assert not _is_score_reply((3, 1.0, True, False, ""), 3)  # JSON gives lists; anything else is not a reply
    assert not _is_score_reply(None, 3)
