"""Final answers: which span of a completion is its final answer, and the one value that span states.

Model output is untrusted input: nothing here runs code; arithmetic goes through `countdown_expr`'s parser.
The rule is written down in docs/verifiers.md; in short:

* The final-answer span is the content of the completion's `<answer>...</answer>` tags, else of its `\\boxed{}`
  (or `\\fbox{}`), else (exact_match) the text after the last `####`, else one line (exact_match: the first line holding
  an ASCII digit, or the last with `number: last`; math_verify: the last line holding a digit or a `\\`).
  Only closed markers count; empty ones are skipped. When a completion holds several non-empty markers of that
  kind, each one is a final answer and every one must be right (`\\boxed{122} or \\boxed{123}` is a hedge).
* The span must state one value: one number (signed, possibly parenthesized: `-(123)` is -123), or a TRUE
  equation whose sides hold one number each (`3 + 4 = 7`; `x = 7`: a side without a number is a label).
  Two numbers (`122 or 123`, `122, 123`, `between 122 and 123`), a false equation (`124=123`), an expression
  that is not a number (`123/0`, `2^2^2^2`, `3+4`), a relation other than `=` (`<`, `\\approx`, `\\pm`) or a
  number glued to a word or command (`1e3`, `0x10`, `5!`, `\\sqrt{4}`) state no single value: 0.
* Sign look-alikes (`countdown_expr.MINUS_SIGNS`: `−` `–` `－` `⁻` ...) read as the sign they look like; every other
  dash, hyphen or minus-like character (`DASH_LIKE`: `〜`, `⸗`, a soft hyphen, `─`) makes a span state no value.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlcompare.rewards.countdown_expr import MINUS_SIGNS, NUMERIC_LIMITS, PLUS_SIGNS, ExprError, evaluate, normalize

MAX_CANDIDATES = 8  # more distinct final answers than this in one completion: a hedge, scored 0 without parsing them

# ----------------------------------------------------------------------------- markers
_BOX = re.compile(r"\\(?:boxed|fbox)")


def answer_tags(text: str, tag: str = "answer") -> list[str]:
    """Contents of every closed `<tag>...</tag>`, in order (linear time); with nested tags the innermost
    (`<answer><answer>5</answer></answer>` -> ['5']). An open tag after the last close is ignored."""
    open_t, close_t = f"<{tag}>", f"</{tag}>"
    out, pos = [], 0
    while True:
        close = text.find(close_t, pos)
        if close < 0:
            return out
        start = text.rfind(open_t, pos, close)
        if start >= 0:
            out.append(text[start + len(open_t) : close])
        pos = close + len(close_t)


def last_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last `<tag>...</tag>` (linear time), or None; with nested tags the innermost."""
    tags = answer_tags(text, tag)
    return tags[-1] if tags else None


_SPACES = re.compile(r" {0,200}")
_SPACE_FORM_END = re.compile(r"[\n$]|\\(?:boxed|fbox|\)|\])")


def _space_form(text: str, j: int) -> tuple[int, int] | None:
    """(start, end) of the content of the space form `\\boxed 5` whose command ends at j: the rest of its line up to
    `$`, `\\)`, `\\]` or the next box, at most 200 characters (None: longer, or empty). Reading one word made
    `\\boxed 17 or 18` state 17; read whole, it is a hedge."""
    window = text[j : j + 201]
    stop = _SPACE_FORM_END.search(window)
    if stop is None and len(window) > 200:
        return None
    content = window[: stop.start() if stop else len(window)]
    a, b = j + len(content) - len(content.lstrip()), j + len(content.rstrip())
    return (a, b) if b > a else None


def _boxes(text: str) -> tuple[list[tuple[int, int]], bool]:
    """(start, end) of the content of every closed `\\boxed{...}` / `\\fbox{...}` in order of opening (the
    `\\boxed 5` form too), and whether the LAST box command is closed. One pass with a stack (linear time)."""
    spans: list[tuple[int, int, int]] = []  # (command position, content start, content end)
    braces: dict[int, int] = {}  # a box's opening brace -> its command position
    last_brace, last_closed = -1, False  # the last command's opening brace (-1: it has none)
    for m in _BOX.finditer(text):
        j = m.end()
        after_spaces = _SPACES.match(text, j).end()
        if text.startswith("{", after_spaces):
            j = after_spaces  # "\boxed {5}" is the brace form
        word = _space_form(text, j) if text.startswith(" ", j) else None
        last_brace, last_closed = -1, word is not None
        if word is not None:  # "\boxed 5"
            spans.append((m.start(), *word))
        elif text.startswith("{", j):
            braces[j] = m.start()
            last_brace = j
    stack = []
    for b in re.finditer(r"[{}]", text) if braces else ():
        k = b.start()
        if text[k] == "{":
            stack.append(k)
        elif stack:
            o = stack.pop()
            if o in braces:
                spans.append((braces[o], o + 1, k))
                last_closed = last_closed or o == last_brace
    spans.sort()
    return [(a, b) for _, a, b in spans], last_closed


def boxed_contents(text: str) -> list[str]:
    """Contents of every closed box that holds no box itself (`\\boxed{\\boxed{5}}` -> ['5']), in order."""
    out = []
    for a, b in _boxes(text)[0]:
        c = text[a:b]
        if _BOX.search(c) is None:
            out.append(c)
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces kept; `\\boxed 5` form too; None
    when the last box is unbalanced."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    spans, last_ok = _boxes(text[i:])
    return text[i:][spans[0][0] : spans[0][1]] if last_ok and spans else None


def after_hashes(text: str) -> str | None:
    """Text after the last `####` (GSM8K style), up to the end of that line."""
    i = text.rfind("####")
    return None if i < 0 else text[i + 4 :].strip().split("\n", 1)[0]


def last_hashes(text: str) -> list[str]:
    """[the text after the LAST `####`] (or []): only the last, since markdown headings start with `####` too."""
    found = after_hashes(text)
    return [] if found is None else [found]


MARKERS = {"answer": answer_tags, "boxed": boxed_contents, "hashes": last_hashes}


def marked_spans(text: str, kinds: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """(kind, non-empty contents) of the first marker kind present in `text`; (None, []) when none is. A kind
    that is present with only empty markers (`<answer> </answer>`) gives (kind, []): no answer."""
    for kind in kinds:
        found = MARKERS[kind](text)
        if found:
            return kind, [s for s in found if s.strip()]
    return None, []


DIGIT = re.compile(r"[0-9]")
DIGIT_OR_BACKSLASH = re.compile(r"[0-9\\]")


def line_with(text: str, wanted: re.Pattern, last: bool) -> str | None:
    """The first (or last) line of `text` in which `wanted` is found."""
    lines = text.splitlines()
    for ln in reversed(lines) if last else lines:
        if wanted.search(ln):
            return ln
    return None


def is_ascii_digit(ch: str) -> bool:
    return "0" <= ch <= "9"


def distinct(spans: list[str]) -> list[str]:
    """The spans without repeats (whitespace-collapsed), in order."""
    seen, out = set(), []
    for s in spans:
        k = " ".join(s.split())
        if k not in seen:
            seen.add(k)
            out.append(s)
    return out


# ----------------------------------------------------------------------------- signs and plain text
_SIGN_TABLE = str.maketrans({**{m: "-" for m in MINUS_SIGNS}, **{p: "+" for p in PLUS_SIGNS}})


def normalize_signs(text: str) -> str:
    """Every sign look-alike (`MINUS_SIGNS`, `PLUS_SIGNS`) as the ASCII sign it looks like."""
    return text.translate(_SIGN_TABLE)


# Every other dash, hyphen or minus in Unicode, and the lines drawn like one: they look like a tilde (`〜`), an equals
# sign (`⸗`), a line (`─`, `¯`) or nothing (a soft hyphen), so neither `-` nor nothing is a safe reading. A span
# holding one states no value: `〜 17` or a soft hyphen before 17 never scores as 17. (tests/rewards/test_final_answer.py
# checks that MINUS_SIGNS and this table cover every character Unicode names a dash, hyphen or minus.)
DASH_LIKE = frozenset(
    "\u00ad\u00af\u00b1\u02c9\u02cd\u0320\u1400\u1680\u2027\u203e\u2053\u21e0\u21e1\u21e2\u21e3\u2213\u2216"
    "\u2238\u2242\u2296\u229d\u229f\u23af\u23e4\u2448\u2500\u2501\u2504\u2505\u2506\u2507\u2508\u2509\u250a"
    "\u250b\u254c\u254d\u254e\u254f\u2574\u2576\u2578\u257a\u257c\u257e\u2756\u279f\u27a0\u290c\u290d\u290e"
    "\u290f\u2910\u293c\u296a\u296b\u296c\u296d\u2a29\u2a2a\u2a2b\u2a2c\u2a3a\u2a41\u2a5c\u2a5d\u2a6c\u2ad8"
    "\u2ae6\u2b37\u2b6a\u2b6b\u2b6c\u2b6d\u2e17\u2e1a\u2e40\u2e43\u301c\u3030\u30a0\u30fc\ufe31\ufe32\ufe49"
    "\ufe4d\uffe3\U0001d104\U0001f4a8\U000e002d"
)


def has_dash_like(text: str) -> bool:
    """Whether `text` holds a character of DASH_LIKE (linear time)."""
    return not DASH_LIKE.isdisjoint(text)


# A relation other than '=' (or a plus-minus): the span does not state one value.
OTHER_RELATION = re.compile(
    r"[<>≤≥≠≈≃≅∼~±∓≡]|\\(?:le|ge|leq|geq|leqslant|geqslant|lt|gt|ne|neq|approx|sim|simeq|cong|equiv|pm|mp|to"
    r"|rightarrow|Rightarrow|implies|iff)(?![A-Za-z])"
)
# Words that join several candidates ("122 or 123", "between 122 and 123") or qualify the one stated ("about 123",
# "at least 123", "not 123", "123 or so"): the span then states no single value. Inside \text{} too.
HEDGE_WORDS = frozenset(
    "or and between either nor maybe perhaps possibly probably likely about approx approximately around roughly nearly"
    " almost circa least most more less fewer greater over under above below than not no except unless plus minus"
    " negative".split()
)
_WORD = re.compile(r"[A-Za-z]+(?:'t)?")


def has_hedge_word(text: str) -> bool:
    """Whether a word of HEDGE_WORDS (any case) or a negation ("isn't") occurs in `text` (linear time)."""
    return any(w.lower() in HEDGE_WORDS or w.endswith("n't") for w in _WORD.findall(text))


_SIGN_WORD = re.compile(r"(?<![A-Za-z])(?:minus|negative)\s*$", re.I)
# LaTeX that only wraps or spaces a number; `\frac{a}{b}` and `^{e}` with plain groups become arithmetic.
_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textrm|mathrm|mathbf|displaystyle|boxed|fbox|left|right|[,;:! ])(?![A-Za-z])|\\\$|\$"
    r"|\\[()\[\]]"
)
# Markdown bold (`**123**`), not a power between operands (`2**3` stays, and is refused as code).
MARKDOWN_BOLD = re.compile(r"(?<![\w)])\*\*|\*\*(?![\w(])")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_SUPERSCRIPT_GROUP = re.compile(r"\^\{([^{}]*)\}")
_NEIGHBOURS = frozenset(".,;:?%'\"$€£¥°")  # what, besides spaces, may touch a number without gluing it to a word


def plain_text(span: str) -> str:
    """The span with sign look-alikes, operator aliases (`×`, `\\times`, ...) and LaTeX wrappers normalized."""
    t = normalize(MARKDOWN_BOLD.sub(" ", normalize_signs(span))).replace("{,}", ",").replace("\\%", "%")
    t = _FRAC.sub(r"((\1)/(\2))", t)
    t = _SUPERSCRIPT_GROUP.sub(r"^(\1)", t)
    return _WRAPPERS.sub(" ", t)


def _in_number(s: str, k: int) -> bool:
    """Whether the '.' or ',' at s[k] belongs to a number: a decimal point before a digit, or a thousands
    separator (a digit before, exactly three after)."""
    ch, n = s[k], len(s)
    nxt = k + 1 < n and is_ascii_digit(s[k + 1])
    if ch == ".":
        return nxt
    if ch == ",":
        group = s[k + 1 : k + 4]
        return (
            k > 0
            and is_ascii_digit(s[k - 1])
            and len(group) == 3
            and all(is_ascii_digit(c) for c in group)
            and not (k + 4 < n and is_ascii_digit(s[k + 4]))
        )
    return False


def _touches_word(s: str, start: int, end: int) -> bool:
    """Whether the number s[start:end] is glued to something other than a space or punctuation (looking through
    braces): `1e3`, `0x10`, `5!`, `\\sqrt{4}`, `f(4)` are not numbers."""
    left = start - 1
    while left >= 0 and s[left] in "{}":
        left -= 1
    right = end
    while right < len(s) and s[right] in "{}":
        right += 1
    return (left >= 0 and not _neighbour(s[left])) or (right < len(s) and not _neighbour(s[right]))


def _neighbour(ch: str) -> bool:
    return ch.isspace() or ch in _NEIGHBOURS  # any space (a no-break space too); a zero-width one is not a space


def numeric_chunks(side: str, *, glued_ok: bool = False, limit: int = 2) -> list[tuple[str, bool]] | None:
    """The arithmetic runs of `side` that hold a digit, as (text, glued to a word), at most `limit` of them
    (linear time); None when one is glued to a word (unless `glued_ok`) or follows the word minus/negative."""
    out: list[tuple[str, bool]] = []
    for m in _RUN.finditer(side):
        for a, b in _split_run(side, m.start(), m.end()):
            run = side[a:b]
            if DIGIT.search(run) is None:
                continue
            a += len(run) - len(run.lstrip())
            b -= len(run) - len(run.rstrip())
            glued = _touches_word(side, a, b)
            if (glued and not glued_ok) or _SIGN_WORD.search(side[max(0, a - 12) : a]):
                return None
            out.append((side[a:b], glued))
            if len(out) >= limit:
                return out
    return out


_RUN = re.compile(r"[0-9+\-*/^() \t\r\n.,]+")


def _split_run(s: str, start: int, end: int):
    """(start, end) of the pieces of the run s[start:end] split at each '.' or ',' that is not inside a number."""
    a = start
    for m in re.finditer(r"[.,]", s[start:end]):
        k = start + m.start()
        if not _in_number(s, k):
            yield a, k
            a = k + 1
    yield a, end


_INTEGER = re.compile(
    r"\s*[-+]?[0-9]{1,100}\s*", re.ASCII
)  # the common case ("17"), read without the full rule (ASCII spaces: the Ogham space mark looks like a dash)


def _side_value(chunk: str) -> tuple[Fraction | None, bool]:
    """(exact value, whether it is a number rather than an expression) of one side's arithmetic run."""
    if _INTEGER.fullmatch(chunk):
        return Fraction(int(chunk)), True
    try:
        ev = evaluate(chunk, numeric=True, **NUMERIC_LIMITS)
    except ExprError:
        return None, False
    return ev.value, ev.operations == 0


def stated_value(span: str) -> Fraction | None:
    """The one number a final-answer span states (exact_match), or None: see the module docstring."""
    if _INTEGER.fullmatch(span):
        return Fraction(int(span))
    text = plain_text(span)
    if OTHER_RELATION.search(text) or has_hedge_word(text) or has_dash_like(text):
        return None
    values, numbers = [], []
    for side in text.split("="):
        chunks = numeric_chunks(side)
        if chunks is None or len(chunks) > 1:
            return None  # glued to a word, or several candidates on one side
        if not chunks:
            continue  # a label ("x", "the answer")
        value, is_number = _side_value(chunks[0][0])
        if value is None:
            return None  # not arithmetic, division by zero, beyond the limits: cannot be checked
        values.append(value)
        if is_number:
            numbers.append(value)
    if not numbers or any(v != values[0] for v in values):
        return None  # no number stated (`3+4`), or a false equation (`124=123`)
    return numbers[0]


# ----------------------------------------------------------------------------- LaTeX (math_verify)
_LABEL = re.compile(
    r"\s*(?:\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\(?!pi\b|infty\b)[A-Za-z]+|[A-Za-z][A-Za-z ]*)"
    r"(?:_\{?[A-Za-z0-9]+\}?)?(?:\s*\([A-Za-z, ]*\))?\s*:?\s*"
)
_DOUBLE_SUPERSCRIPT = re.compile(r"\^\s*(?:\{[^{}]*\}|\\[A-Za-z]+|[A-Za-z0-9.]+)\s*\^")
_LATEX_LIST = re.compile(r"\\(?:pm|mp|lor|vee|land|wedge|cup|quad|qquad)(?![A-Za-z])|[±∓∨∧∪;]")


def lists_values(span: str) -> bool:
    """Whether the span lists several values: a hedge word, `;`, `\\pm`, `\\lor`, `\\cup`, `\\quad`, or a comma
    outside brackets that is not a thousands separator (`122, 123`; `(-2, 2)` and `1,000` are one value)."""
    if has_hedge_word(span) or _LATEX_LIST.search(span):
        return True
    depth = 0
    for k, ch in enumerate(span):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0 and not _in_number(span, k):
            return True
    return False


def double_superscript(span: str) -> bool:
    """`2^2^2^2` is a LaTeX error ("double superscript") that parsers read either way (256 or 65536)."""
    return _DOUBLE_SUPERSCRIPT.search(span) is not None


def looks_latex(text: str) -> bool:
    return any(ch in text for ch in "\\{}^_")


def split_math(span: str) -> tuple[list[str], str] | None:
    """(contents of the `$...$` / `\\(...\\)` / `\\[...\\]` segments, the text outside them); None without any."""
    t = span.replace("$$", "$").replace("\\(", "$").replace("\\)", "$").replace("\\[", "$").replace("\\]", "$")
    if "$" not in t:
        return None
    parts = t.split("$")
    return [p for p in parts[1::2] if p.strip()], " ".join(parts[0::2])


def equation_sides(text: str) -> list[str]:
    """The sides of a statement split at '=' (outside braces), leading labels (`x`, `f(x)`, `\\text{Answer}`)
    and empty sides dropped: `x = \\frac{1}{2} = 0.5` -> ['\\frac{1}{2}', '0.5']."""
    sides, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        elif ch == "=" and depth == 0:
            sides.append(text[start:k])
            start = k + 1
    sides.append(text[start:])
    sides = [s for s in sides if s.strip()]
    while len(sides) > 1 and _LABEL.fullmatch(sides[0]):
        sides.pop(0)
    return sides


def math_statement(span: str) -> list[str] | None:
    """The sides (LaTeX) of the one statement a math_verify span makes, labels dropped; None when the span lists
    several values, states another relation, or holds several numbers in prose."""
    text = MARKDOWN_BOLD.sub(" ", normalize_signs(span))
    if lists_values(text) or OTHER_RELATION.search(text) or double_superscript(text) or has_dash_like(text):
        return None
    segments = split_math(text)
    if segments is not None:
        inside, outside = segments
        if len(distinct(inside)) != 1 or any(is_ascii_digit(ch) for ch in outside):
            return None  # `$122$ $123$`, or a number outside the math as well
        return equation_sides(inside[0]) or None
    if looks_latex(text):
        return equation_sides(text) or None
    out = []
    for side in equation_sides(text):
        chunks = numeric_chunks(side, glued_ok=True)
        if chunks is None or len(chunks) != 1:
            return None  # several numbers in prose ("the sum 100 + 23 is 123"), or none
        chunk, glued = chunks[0]
        out.append(side if glued else chunk)  # the number alone keeps its sign (`- 123`); `123!` stays whole
    return out or None
