"""A small, safe arithmetic parser for Countdown answers. Model output is untrusted input.

Nothing here calls eval/exec. The grammar is tiny and evaluated with exact rationals
(`fractions.Fraction`):

    expr   := term   (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INTEGER | '(' expr ')'

Accepted symbols: ASCII digits, `+ - * /`, parentheses and spaces; `×`, `·`, `∗`, `\\times`, `\\cdot`
read as `*`, `÷`, `\\div` as `/`, and every sign look-alike in `MINUS_SIGNS` / `PLUS_SIGNS` (`−` U+2212, `–` en
dash, `－` full-width minus, ...) as `-` / `+`. Everything else is refused: unary minus/plus, `**` and `^`
(power), decimals, unicode digits (`١٢٣`, `１２３`), names, calls.

`evaluate(text, numeric=True)` is the wider grammar exact_match uses to check the sides of an equation in a
final answer (`docs/verifiers.md`): decimals and thousands separators (`1,000.5`), unary signs (`-(123)` is
-123) and `^` (right-associative, integer exponents: `2^2^2^2` is 2^16 = 65536), with the same kind of limits
(`NUMERIC_LIMITS`):

    expr   := term  (('+' | '-') term)*
    term   := unary (('*' | '/') unary)*
    unary  := ('+' | '-') unary | power
    power  := atom ('^' unary)?
    atom   := NUMBER | '(' expr ')'

Hard limits keep every evaluation cheap: at most `max_len` characters (512), parenthesis depth
`max_depth` (32), integer literals up to `max_literal` (10**6), and every intermediate result's
numerator and denominator up to `max_abs` (10**12). Division by zero is an `ExprError`, like every
other refusal; callers catch `ExprError` (a `ValueError`) and nothing else escapes.

Countdown references travel as a JSON string: `encode_countdown([3, 5, 7], 22)` ->
`'{"nums": [3, 5, 7], "target": 22}'`; `decode_countdown` reads it back.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

MAX_LEN = 512
MAX_DEPTH = 32
MAX_LITERAL = 10**6
MAX_ABS = 10**12

# Sign look-alikes, one table for every verifier: each reads as the ASCII sign, so '−123' (U+2212), '–123' (en
# dash), '－123' (full-width) keep their minus; read as nothing, they made -123 score correct against 123.
# Every dash drawn as one short stroke is a minus (a raised or lowered one too: '⁻ 17' is -17, not 17). Dashes that
# look like something else ('〜' a tilde, '⸗' an equals sign) or cannot be seen (a soft hyphen) are answers.DASH_LIKE:
# refused. tests/rewards/test_final_answer.py checks that the two tables cover every dash, hyphen and minus in Unicode.
MINUS_SIGNS = (
    "\u2212\u2013\u2014\u2012\u2010\u2011\ufe63\uff0d\u02d7\u2796"  # − – — ‒ ‐ ‑ ﹣ － ˗ ➖
    "\u2015\u2043\u2052\u207b\u208b\ufe58\u2e3a\u2e3b"  # ― ⁃ ⁒ ⁻ ₋ ﹘ ⸺ ⸻
    "\u058a\u05be\u1806\u2e5d\U00010ead"  # hyphens of other scripts: Armenian, Hebrew, Mongolian, oblique, Yezidi
)
PLUS_SIGNS = "\ufe62\uff0b\u2795\u207a\u208a\ufb29"  # ﹢ ＋ ➕ ⁺ ₊ ﬩
_LATEX_ALIASES = (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"))
_CHAR_ALIASES = str.maketrans(
    {"×": "*", "·": "*", "∗": "*", "⋅": "*", "÷": "/", **{m: "-" for m in MINUS_SIGNS}, **{p: "+" for p in PLUS_SIGNS}}
)
_OPS = "+-*/()"
# numeric mode: a decimal number, optionally with thousands separators (groups of exactly 3) or a leading point
_DECIMAL = re.compile(r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+")
NUMERIC_LIMITS = dict(max_len=512, max_depth=32, max_literal=10**100, max_abs=10**100)


class ExprError(ValueError):
    """The text is not a valid Countdown expression (or breaks a limit)."""


@dataclass(frozen=True)
class Evaluation:
    value: Fraction
    numbers: tuple  # the literals in the order they appear (int; Fraction in numeric mode)
    operations: int = 0  # binary operations (+ - * / ^): 0 means a number, possibly signed or parenthesized


def normalize(text: str) -> str:
    """Operator and sign aliases as ASCII operators."""
    if "\\" in text:
        for a, b in _LATEX_ALIASES:
            text = text.replace(a, b)
    return text.translate(_CHAR_ALIASES)


def tokenize(
    text: str, *, max_len: int = MAX_LEN, max_literal: int = MAX_LITERAL, numeric: bool = False
) -> list[str | int | Fraction]:
    """Numbers and single-character operators; raises ExprError on anything else. `numeric`: decimal numbers
    (Fractions) and `^` as well (see the module docstring)."""
    if len(text) > max_len:
        raise ExprError(f"expression longer than {max_len} characters")
    text = normalize(text)
    out: list[str | int | Fraction] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif numeric and ("0" <= ch <= "9" or ch == "."):
            m = _DECIMAL.match(text, i)
            if m is None:
                raise ExprError(f"character {ch!r} is not allowed")
            out.append(_numeric_literal(m.group(0), max_literal))
            i = m.end()
        elif "0" <= ch <= "9":
            j = i
            while j < n and "0" <= text[j] <= "9":
                j += 1
            if j - i > 7:  # longer than any literal we accept; do not even build the int
                raise ExprError(f"number literal larger than {max_literal}")
            v = int(text[i:j])
            if v > max_literal:
                raise ExprError(f"number literal {v} larger than {max_literal}")
            if j < n and text[j] == ".":
                raise ExprError("decimal numbers are not allowed")
            out.append(v)
            i = j
        elif ch in _OPS or (numeric and ch == "^"):
            if ch == "*" and i + 1 < n and text[i + 1] == "*":
                raise ExprError("'**' (power) is not allowed")
            out.append(ch)
            i += 1
        else:
            raise ExprError(f"character {ch!r} is not allowed")
    if not out:
        raise ExprError("empty expression")
    return out


def _numeric_literal(text: str, max_literal: int) -> Fraction:
    digits = text.replace(",", "")
    if len(digits) > len(str(max_literal)):  # do not even build a number that long
        raise ExprError(f"number literal larger than {max_literal}")
    v = Fraction(digits)
    if v > max_literal:
        raise ExprError(f"number literal {text} larger than {max_literal}")
    return v


class _Parser:
    def __init__(self, tokens, max_depth: int, max_abs: int, numeric: bool = False):
        self.toks, self.pos, self.depth = tokens, 0, 0
        self.max_depth, self.max_abs, self.numeric = max_depth, max_abs, numeric
        self.numbers: list = []
        self.operations = 0

    def peek(self):
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self):
        t = self.peek()
        self.pos += 1
        return t

    def check(self, v: Fraction) -> Fraction:
        if abs(v.numerator) > self.max_abs or v.denominator > self.max_abs:
            raise ExprError(f"intermediate result beyond {self.max_abs}")
        return v

    def enter(self, what: str) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise ExprError(f"{what} nested deeper than {self.max_depth}")

    def expr(self) -> Fraction:
        v = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            r = self.term()
            self.operations += 1
            v = self.check(v + r if op == "+" else v - r)
        return v

    def term(self) -> Fraction:
        v = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            r = self.unary()
            self.operations += 1
            if op == "*":
                v = self.check(v * r)
            else:
                if r == 0:
                    raise ExprError("division by zero")
                v = self.check(v / r)
        return v

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            if not self.numeric:
                raise ExprError("unary plus/minus is not allowed")
            op = self.take()
            self.enter("signs")
            v = self.unary()
            self.depth -= 1
            return -v if op == "-" else v
        return self.power() if self.numeric else self.factor()

    def power(self) -> Fraction:
        base = self.factor()
        if self.peek() != "^":
            return base
        self.take()
        self.enter("powers")
        exponent = self.unary()  # right-associative: 2^2^2 is 2^(2^2); 2^-1 is 1/2
        self.depth -= 1
        self.operations += 1
        return self.check(_power(base, exponent, self.max_abs))

    def factor(self) -> Fraction:
        t = self.take()
        if isinstance(t, (int, Fraction)):
            self.numbers.append(t)
            return Fraction(t)
        if t == "(":
            self.enter("parentheses")
            v = self.expr()
            if self.take() != ")":
                raise ExprError("unbalanced parentheses")
            self.depth -= 1
            return v
        if t is None:
            raise ExprError("expression ends early")
        if t in ("+", "-"):
            raise ExprError("unary plus/minus is not allowed")
        raise ExprError(f"unexpected {t!r}")


def _power(base: Fraction, exponent: Fraction, max_abs: int) -> Fraction:
    """base ** exponent for an integer exponent, refused before computing when the result must pass max_abs."""
    if exponent.denominator != 1:
        raise ExprError("only integer exponents are allowed")
    e = exponent.numerator
    if base == 0 and e < 0:
        raise ExprError("division by zero")
    if base == 0:
        return Fraction(0 if e else 1)
    if abs(base) == 1:  # any exponent, no work: 1 or -1 by parity
        return base if e % 2 else Fraction(1)
    least_bits = (max(abs(base.numerator), base.denominator).bit_length() - 1) * abs(e)  # a lower bound
    if least_bits > max_abs.bit_length():
        raise ExprError(f"intermediate result beyond {max_abs}")
    return base**e


def evaluate(
    text: str,
    *,
    max_len: int = MAX_LEN,
    max_depth: int = MAX_DEPTH,
    max_literal: int = MAX_LITERAL,
    max_abs: int = MAX_ABS,
    numeric: bool = False,
) -> Evaluation:
    """Exact value of `text` and the literals it uses; ExprError when invalid. `numeric`: the wider grammar
    (decimals, unary signs, `^`); its callers pass `**NUMERIC_LIMITS`."""
    if not isinstance(text, str):
        raise ExprError("expression must be a string")
    p = _Parser(tokenize(text, max_len=max_len, max_literal=max_literal, numeric=numeric), max_depth, max_abs, numeric)
    v = p.expr()
    if p.pos != len(p.toks):
        raise ExprError(f"unexpected {str(p.toks[p.pos])!r} after the expression")
    return Evaluation(v, tuple(p.numbers), p.operations)


def uses_numbers(used, nums, *, require_all: bool = False) -> bool:
    """Each given number used at most once (require_all: exactly once), counting duplicates."""
    have, want = Counter(used), Counter(nums)
    if any(have[k] > want[k] for k in have):
        return False
    return have == want if require_all else True


def encode_countdown(nums, target) -> str:
    return json.dumps({"nums": [int(n) for n in nums], "target": int(target)})


def decode_countdown(answer) -> tuple[list[int], int]:
    """The reference `{"nums": [...], "target": N}` (JSON string or dict) -> (nums, target)."""
    d = json.loads(answer) if isinstance(answer, str) else answer
    if not isinstance(d, dict) or "nums" not in d or "target" not in d:
        raise ValueError(f'countdown reference must be JSON {{"nums": [...], "target": N}}, got {str(answer)[:80]!r}')
    nums, target = d["nums"], d["target"]
    if not isinstance(nums, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in nums):
        raise ValueError(f"countdown reference 'nums' must be a list of integers, got {nums!r}"[:200])
    if not isinstance(target, int) or isinstance(target, bool):
        raise ValueError(f"countdown reference 'target' must be an integer, got {target!r}"[:200])
    return nums, target
