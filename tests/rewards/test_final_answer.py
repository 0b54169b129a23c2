"""The final-answer rule (docs/verifiers.md): which span is the final answer, and that it must state ONE value.

Known-equivalent and known-different pairs per verifier, worked by hand from the rule, and a seeded property
test: completions built from a small grammar whose meaning is known by construction score correct exactly
when the value they state equals the reference.
"""

import functools
import random
import unicodedata
from fractions import Fraction

import pytest

from rlcompare.rewards import countdown_expr as ce
from rlcompare.rewards.answers import DASH_LIKE, boxed_contents, last_boxed, numeric_chunks, stated_value
from rlcompare.rewards.verifiers import build_verifier

EM = build_verifier({"name": "exact_match"})
CD = ce.encode_countdown([3, 5, 7], 22)


def correct(v, completion, answer):
    s = v.score(completion, answer)
    assert not s.error, (completion, answer, s)
    return s.correct


@pytest.fixture(scope="module")
def mv():
    return build_verifier({"name": "math_verify", "timeout_s": 10.0})  # direct calls: math-verify in this process


# ---------------------------------------------------------------- exact_match
SAME_AS_123 = [
    "123",
    "\\boxed{123}",
    "The answer is 123.",
    "123.0",  # decided: the same value (documented)
    "123.000 dollars",
    "<answer>123</answer>",
    "<answer> 123 </answer>",
    "#### 123",
    "x = 123",
    "<answer>120 + 3 = 123</answer>",  # a true equation states its number
    "<answer>2 * 60 + 3 = 123</answer>",
    "\\boxed{\\frac{246}{2} = 123}",
    "(123)",
    "+123",
    "**123**",  # markdown bold
    "The answer is $123$.",
    "\\boxed{123} and again \\boxed{123}",  # the same answer twice is one answer
    "Let me think.\n\\boxed{123}\nDone, 5 stars.",
    "123\n122 was my first guess",  # unmarked: the first line holding a digit
    "123\u00a0dollars",  # a no-break space is a space
    "#### Step 1: add 100 and 23\n100 + 23 = 123\n#### 123",  # only the last ####: markdown headings use it too
]
DIFFERENT_FROM_123 = [
    "122 or 123",  # more than one candidate
    "<answer>122 or 123</answer>",
    "\\boxed{122 \\text{ or } 123}",
    "122, 123",
    "<answer>122, 123</answer>",
    "between 122 and 123",
    "<answer>between 122 and 123</answer>",
    "\\boxed{122} or \\boxed{123}",  # two different final answers
    "<answer>122</answer> <answer>123</answer>",
    "\\boxed{124=123}",  # a false equation
    "<answer>3 + 4 = 123</answer>",
    "\\boxed{123 = 123.5}",
    "-(123)",  # that is -123
    "\\boxed{-(123)}",
    "−123",  # U+2212 minus
    "–123",  # en dash
    "－123",  # full-width minus
    "- 123",
    "minus 123",
    "123/0",  # code-like: no value
    "\\boxed{123/0}",
    "<answer>123/0 = 123</answer>",
    "120+3",  # an expression is not a stated number
    "\\boxed{\\approx 123}",  # not an equality
    "\\boxed{\\pm 123}",
    "123 < 124",
    "123!",  # glued to something: not the number 123
    "\\sqrt{123}",
    "1e3 123",
    "0x7B",
    "12 3",
    "１２３",
    "<answer></answer> 123",  # the marker is there and empty: no answer
    "123 or so",  # a qualified number is not that number
    "about 123",
    "<answer>at least 123</answer>",
    "not 123",
    "\\boxed{\\text{not } 123}",
    "The answer is 123, not 122",
]


@pytest.mark.parametrize("completion", SAME_AS_123)
def test_exact_match_equivalents(completion):
    assert correct(EM, completion, "123")


@pytest.mark.parametrize("completion", DIFFERENT_FROM_123)
def test_exact_match_differents(completion):
    assert not correct(EM, completion, "123")


@pytest.mark.parametrize(
    "completion",
    [
        "-(123)",
        "\\boxed{-(123)}",
        "−123",
        "–123",
        "－123",
        "- 123",
        "(-123)",
        "<answer>-123</answer>",
        "x = −123",
        "\\boxed{- 123}",
    ],
)
def test_exact_match_sign_look_alikes_keep_their_sign(completion):
    assert correct(EM, completion, "-123") and not correct(EM, completion, "123")


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("1,234", "1234", True),  # decided: a thousands separator (groups of exactly 3)
        ("1234", "1,234", True),
        ("\\boxed{1{,}234}", "1234", True),  # LaTeX's braced comma
        ("1,23,4", "1234", False),
        ("2^2^2^2", "16", False),  # a power tower is an expression, not a stated number
        ("2^2^2^2", "65536", False),
        ("2^2^2^2", "2", False),  # (main read its last number: 2)
        ("2^2^2^2 = 65536", "65536", True),  # `^` is right-associative: 2^(2^(2^2)) = 2^16
        ("2^2^2^2 = 16", "16", False),
        ("2^10 = 1024", "1024", True),
        ("\\boxed{2^{10} = 1024}", "1024", True),
        ("9^9^9 = 5", "5", False),  # beyond the limits: cannot be checked, so 0
        ("<answer>1/2</answer>", "0.5", False),  # an expression, not a number
        ("<answer>1/2 = 0.5</answer>", "0.5", True),
        ("0.50", "0.5", True),
        (".5", "0.5", True),
    ],
)
def test_exact_match_decisions(completion, answer, expected):
    assert correct(EM, completion, answer) is expected


def test_exact_match_number_last_reads_the_last_line_with_a_digit():
    v = build_verifier({"name": "exact_match", "number": "last"})
    assert correct(v, "x = 2, so\n2 + 121 = 123", "123")
    assert not correct(v, "the answer is 123\nor maybe 122", "123")
    assert not correct(v, "so 122 or 123", "123")


def test_the_embedded_task_reads_its_normal_completions():
    # prompts "a+b=", completions "17" then EOS (decoded without special tokens)
    assert correct(EM, "17", "17") and correct(EM, " 17", "17") and correct(EM, "17\n", "17")
    assert not correct(EM, "18", "17") and not correct(EM, "", "17") and not correct(EM, "1 7", "17")


# ---------------------------------------------------------------- math_verify
MATH_SAME = [
    ("\\boxed{123}", "123"),
    ("The answer is 123.", "123"),
    ("The answer is $123$.", "123"),
    ("\\boxed{123.0}", "123"),
    ("\\boxed{x = 123}", "123"),
    ("\\boxed{\\frac{246}{2}}", "123"),
    ("\\boxed{\\frac{246}{2} = 123}", "123"),
    ("<answer>123</answer>", "123"),
    ("\\boxed{1,234}", "1234"),
    ("\\boxed{-(123)}", "-123"),
    ("- 123", "-123"),
    ("−123", "-123"),
    ("\\boxed{－123}", "-123"),
    ("\\boxed{123} then \\boxed{123}", "123"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{(-2, 2)}", "(-2,2)"),  # a tuple/interval reference is compared whole
    ("\\boxed{2, 1}", "1, 2"),  # a set reference: its own list
    ("\\boxed{x = 2}", "x = 2"),  # an equation reference
]
MATH_DIFFERENT = [
    ("\\boxed{124=123}", "123"),  # a false equation (math-verify alone compared its right side)
    ("\\boxed{x = 124 = 123}", "123"),
    ("122 or 123", "123"),  # math-verify alone read the last number
    ("<answer>122 or 123</answer>", "123"),
    ("122, 123", "123"),
    ("between 122 and 123", "123"),
    ("\\boxed{122 \\lor 123}", "123"),
    ("\\boxed{\\approx 123}", "123"),
    ("\\boxed{\\pm 123}", "123"),
    ("\\boxed{122} or \\boxed{123}", "123"),
    ("$122$ $123$", "123"),
    ("The sum 100 + 23 is 123", "123"),
    ("- 123", "123"),  # math-verify alone dropped the spaced sign
    ("−123", "123"),
    ("\\boxed{-(123)}", "123"),
    ("\\boxed{123/0}", "123"),
    ("\\boxed{2^2^2^2}", "16"),  # a double superscript is a LaTeX error: scored 0 whatever the reading
    ("\\boxed{2^2^2^2}", "65536"),
    ("\\boxed{2^2^2^2}", "256"),
    ("123!", "123"),
    ("\\boxed{123 < 124}", "123"),
    ("\\boxed{\\text{about } 123}", "123"),
    ("<answer>not 123</answer>", "123"),
    ("The answer is 123 or so.", "123"),
]


@pytest.mark.parametrize("completion, answer", MATH_SAME)
def test_math_verify_equivalents(mv, completion, answer):
    assert correct(mv, completion, answer)


@pytest.mark.parametrize("completion, answer", MATH_DIFFERENT)
def test_math_verify_differents(mv, completion, answer):
    assert not correct(mv, completion, answer)


# ---------------------------------------------------------------- countdown, format, weighted
@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>3*5+7</answer>", True),
        ("<answer>3*5+7</answer> <answer>7+3*5</answer>", True),  # two right answers
        ("<answer>(3+5)*7</answer> <answer>3*5+7</answer>", False),  # a hedge across tags (main read the last: 1)
        ("<answer>3*5+7 or 3+5+7</answer>", False),
        ("<answer>3*5+7, 3+5+7</answer>", False),
        ("<answer>3*5+7 = 23</answer>", False),
        ("<answer>3*5+7 = 22</answer>", True),
        ("<answer>-(3*5+7)</answer>", False),  # unary minus refused (and it is -22)
    ],
)
def test_countdown_final_answer(completion, expected):
    assert correct(build_verifier({"name": "countdown"}), completion, CD) is expected


@pytest.mark.parametrize("minus", ["-", "−", "–", "－"])
def test_countdown_sign_look_alikes_read_as_minus(minus):
    ref = ce.encode_countdown([25, 3], 22)
    assert correct(build_verifier({"name": "countdown"}), f"<answer>25{minus}3</answer>", ref)
    assert not correct(build_verifier({"name": "countdown"}), f"<answer>3{minus}25</answer>", ref)


def test_format_checks_the_form_only_and_weighted_takes_correct_from_its_first_component():
    fmt = build_verifier({"name": "format"})
    hedge = "<think>try both</think> <answer>3*5+7 or 3+5+7</answer>"
    assert correct(fmt, hedge, "")  # documented: format rewards the form, never a value
    mix = build_verifier(
        {"name": "weighted", "components": [{"name": "countdown", "weight": 1.0}, {"name": "format", "weight": 0.1}]}
    )
    s = mix.score(hedge, CD)
    assert s.reward == pytest.approx(0.1) and not s.correct
    s = build_verifier(
        {"name": "weighted", "components": [{"name": "exact_match", "weight": 1.0}, {"name": "format", "weight": 0.1}]}
    ).score("<think>x</think> <answer>122 or 123</answer>", "123")
    assert s.reward == pytest.approx(0.1) and not s.correct


# ---------------------------------------------------------------- the pieces
def test_stated_value_by_hand():
    assert stated_value("The answer is 1,000.5 dollars.") == Fraction(2001, 2)
    assert stated_value("x = 3/4 = 0.75") == Fraction(3, 4)
    assert stated_value("-(2.5)") == Fraction(-5, 2)
    assert stated_value("3/4") is None and stated_value("x") is None and stated_value("") is None
    assert stated_value("0.75 = 3/4 = 0.7") is None


def test_numeric_chunks_stop_at_two_and_refuse_glued_numbers():
    assert numeric_chunks("so 3 + 4 and 5 and 6") == [("3 + 4", False), ("5", False)]
    assert numeric_chunks("x2") is None and numeric_chunks("\\sqrt{4}") is None
    assert numeric_chunks("\\sqrt{4}", glued_ok=True) == [("4", True)]


def test_boxes_are_read_in_one_pass_with_nested_and_unclosed_boxes():
    assert boxed_contents("\\boxed{1} \\boxed{\\frac{1}{2}} \\boxed 7$") == ["1", "\\frac{1}{2}", "7"]
    assert boxed_contents("\\boxed{\\boxed{5}}") == ["5"]
    assert last_boxed("\\boxed{1} \\boxed{2") is None and last_boxed("\\boxed{1} \\boxed{2}") == "2"
    assert boxed_contents("\\boxed{" * 50_000) == [] and last_boxed("\\boxed{" * 50_000 + "}") is not None


# ---------------------------------------------------------------- the space-form box and every dash (issue #41)
@pytest.mark.parametrize(
    "completion", ["\\boxed 17 or 18", "$\\boxed 17 or 18$.", "\\boxed 17 \\boxed 18", "\\boxed 17, 18\n"]
)
def test_space_form_box_is_read_to_the_end_of_its_line(mv, completion):
    """`\\boxed 17 or 18` was read as the one word after `\\boxed`: 17, correct against 17 (a hedge)."""
    for ref in ("17", "18"):
        assert not correct(EM, completion, ref) and not correct(mv, completion, ref)


def test_space_form_box_still_states_its_number(mv):
    for completion in ("\\boxed 17", "$\\boxed 17$ is my answer", "\\boxed 17.\nThen 18 more steps"):
        assert correct(EM, completion, "17") and correct(mv, completion, "17"), completion
    assert boxed_contents("\\boxed 17 or 18$ and 19") == ["17 or 18"]
    assert boxed_contents("\\boxed {17} or 18") == ["17"]  # a space before the brace: the brace form
    assert boxed_contents("\\boxed 5 \\boxed{6} \\boxed " + "7" * 300) == ["5", "6"]  # past 200 characters: not closed


@functools.lru_cache(maxsize=1)
def unicode_dashes() -> tuple[str, ...]:
    """Every character Unicode calls a dash (category Pd) or names a dash, hyphen or minus, and the lines drawn like
    a minus (macrons, overlines, box-drawing lines, the Ogham space mark, the katakana prolonged sound mark)."""
    named = [
        c
        for c in map(chr, range(0x110000))
        if unicodedata.category(c) == "Pd" or any(w in unicodedata.name(c, "") for w in ("MINUS", "HYPHEN", "DASH"))
    ]
    return tuple(c for c in named if c != "-") + tuple("\u00af\u02c9\u02cd\u203e\uffe3\u2500\u2501\u23af\u1680\u30fc")


def test_every_unicode_dash_is_a_sign_or_refused():
    missing = [
        f"U+{ord(c):04X} {unicodedata.name(c, '')}"
        for c in unicode_dashes()
        if c not in ce.MINUS_SIGNS + "".join(DASH_LIKE)
    ]
    assert missing == []
    assert not set(ce.MINUS_SIGNS) & DASH_LIKE


def _forms(dash: str) -> list[str]:
    return [f"{dash} 17", f"{dash}17", f"<answer>{dash} 17</answer>", f"\\boxed{{{dash} 17}}", f"x = {dash} 17"]


def test_no_dash_before_a_number_reads_as_nothing():
    """`⁻ 17`, `₋ 17`, `﹘ 17`, a soft hyphen before 17 ... scored as +17 (exact_match and math_verify)."""
    wrong = [(f, ref) for c in unicode_dashes() for f in _forms(c) for ref in ("17",) if correct(EM, f, ref)]
    assert wrong == []
    minus = [f for c in ce.MINUS_SIGNS for f in _forms(c) if not correct(EM, f, "-17")]
    assert minus == []
    assert correct(EM, "\u207a 17", "17") and correct(EM, "\u207a17", "17")  # a raised plus is a plus


def test_no_dash_before_a_number_reads_as_nothing_math_verify(mv):
    wrong = [f for c in unicode_dashes() for f in _forms(c)[:2] if correct(mv, f, "17")]
    assert wrong == []
    assert all(correct(mv, f, "-17") for c in ce.MINUS_SIGNS for f in _forms(c)[:2])


@pytest.mark.parametrize("dash", ["\u207b", "\u208b", "\ufe58", "\u00ad", "\u2015", "\u301c", "\u1680"])
def test_the_reported_dashes_in_math_verify(mv, dash):
    assert not correct(mv, f"{dash} 17", "17") and not correct(mv, f"\\boxed{{{dash} 17}}", "17")
    assert correct(mv, f"{dash} 17", "-17") is (dash in ce.MINUS_SIGNS)


# ---------------------------------------------------------------- property
MINUS_LOOKS = ["-", "\u2212", "\u2013", "\uff0d", "- "]


def _render_number(rng, n: int) -> str:
    """One way of writing the integer n; every one of them states n."""
    sign = "" if n >= 0 else rng.choice(MINUS_LOOKS)
    a = abs(n)
    body = rng.choice([str(a), f"{a:,}", f"{a}.0", f"{a}.00"])
    if n < 0 and rng.random() < 0.3:
        return f"{sign}({body})"
    if n >= 0 and rng.random() < 0.2:
        return "+" + body
    return sign + body


def _statement(rng, ref: int) -> tuple[str, int | None, int | None]:
    """(text, the one NUMBER it states or None, the one VALUE it denotes or None) for a random final-answer
    statement near `ref`: the two differ only for a bare expression (`123 + 0` denotes 123 but states no number;
    exact_match wants a number, math_verify an equivalent value)."""
    n = rng.choice([ref, ref, ref + 1, ref - 1, -ref, ref * 10])
    kind = rng.randrange(6)
    if kind == 0:
        return _render_number(rng, n), n, n
    if kind == 1:  # several candidates: a hedge, whatever they are
        others = [_render_number(rng, m) for m in (n, n + rng.choice([1, 2, -1]))]
        rng.shuffle(others)
        return rng.choice([" or ", ", ", " and ", "; "]).join(others), None, None
    if kind == 2:  # a true equation
        a = rng.randrange(0, 50)
        text = f"{a} + {n - a}" if n - a >= 0 else f"{a} - {a - n}"
        return f"{text} = {_render_number(rng, n)}", n, n
    if kind == 3:  # a false one: a + |n - a| + 1 is n + 1 for n >= a, and odd-vs-even 2a + 1 = 2n is impossible below
        a = rng.randrange(0, 50)
        return f"{a} + {abs(n - a) + 1} = {_render_number(rng, n)}", None, None
    if kind == 4:  # a label
        return f"{rng.choice(['x', 'y', 'The answer', 'total'])} = {_render_number(rng, n)}", n, n
    if rng.random() < 0.5:
        return f"{rng.randrange(1, 9)}/0", None, None  # no value at all
    return f"{n} + 0", None, n  # an expression: a value, but no stated number


def _wrap(rng, statement: str, unmarked_first: bool = True) -> str:
    """The statement as a completion's final answer, after (or, unmarked, around) reasoning with other numbers."""
    noise = f"First I computed {rng.randrange(1000)} and {rng.randrange(1000)}.\n"
    form = rng.randrange(5)
    if form == 3 and not unmarked_first:  # math_verify reads the last line holding a digit
        return noise + f"The answer is {statement}."
    if form == 0:
        return noise + f"<answer>{statement}</answer>"
    if form == 1:
        return noise + f"So the answer is \\boxed{{{statement}}}."
    if form == 2:
        return noise + f"#### {statement}"
    if form == 3:
        return f"The answer is {statement}.\n" + noise  # unmarked: the first line holding a digit
    return f"<think>{noise}</think> <answer>{statement}</answer>"


def test_property_exact_match_is_correct_exactly_when_the_stated_value_is_the_reference():
    rng = random.Random(18)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        ref = rng.choice([0, 7, 123, 1234, 98765, -42])
        statement, value, _ = _statement(rng, ref)
        completion = _wrap(rng, statement)
        got = correct(EM, completion, str(ref))
        assert got is (value == ref), (completion, ref, value)
        seen[got] += 1
    assert min(seen.values()) > 300  # both outcomes are well covered


def test_property_math_verify_is_correct_exactly_when_the_denoted_value_is_the_reference(mv):
    rng = random.Random(1818)
    for _ in range(120):
        ref = rng.choice([7, 123, 1234, -42])
        statement, _, value = _statement(rng, ref)
        if "#### " in (completion := _wrap(rng, statement, unmarked_first=False)):
            continue  # math_verify does not read ####
        assert correct(mv, completion, str(ref)) is (value == ref), (completion, ref, value)
