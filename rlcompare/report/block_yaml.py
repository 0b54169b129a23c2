"""config.yaml read fast: the block YAML that `rlcompare train` writes (OmegaConf.to_yaml: `key: value` mappings
nested by indentation, lists of scalars as `- value` lines) parsed line by line, each scalar's text resolved by
PyYAML itself and remembered, since a results folder repeats the same values thousands of times. PyYAML's own
constructor (Python, even over libyaml) was most of a report's time over many runs (issue 41 item 19).

`read_block_yaml` returns None for anything else (flow collections, anchors, tags, comments, block or multi-line
scalars, lists of mappings, blank lines, tabs): the caller then reads the text with PyYAML. Where it returns a
dict, that dict equals yaml.safe_load's (tests/report/test_report_fast_readers.py)."""

from __future__ import annotations

import functools
import re
from typing import Any, Optional

import yaml

# a plain key: one word of these characters (a longer or quoted key, `<<`, `? ...`: PyYAML reads it)
_KEY_LINE = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.\-/]{0,200}):(?: (.*))?")
_NOT_PLAIN_START = frozenset("&*!|>%@`#{}[],?:")  # indicators a plain scalar cannot start with
_OTHER_LINE_BREAKS = ("\t", "\r", "\x85", "\u2028", "\u2029", "\ufeff")  # YAML reads these otherwise than str.split


class _Unsupported(Exception):
    """A construct this reader leaves to PyYAML."""


def read_block_yaml(text: str) -> Optional[dict]:
    """The mapping yaml.safe_load(text) returns, or None where the text is not the simple block YAML read here."""
    if any(ch in text for ch in _OTHER_LINE_BREAKS):
        return None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline
    try:
        mapping, end = _mapping(lines, 0, 0)
    except Exception:  # _Unsupported, or a scalar PyYAML refuses: PyYAML reads the whole text and says so
        return None
    return mapping if end == len(lines) and mapping else None


_BELOW = object()  # `key:` with its value on the lines below
_EMPTY = {"[]": list, "{}": dict}  # a new empty list or mapping each time


@functools.lru_cache(maxsize=1 << 16)
def _line(line: str) -> tuple[int, bool, Any, Any]:
    """(indent, whether a `- ` item, key, value): a line read once however many configs hold it. The value is
    _BELOW, a scalar, or list/dict (a new empty one)."""
    indent = len(line) - len(line.lstrip(" "))
    if line.startswith("- ", indent):
        return indent, True, None, _value(line[indent + 2 :])
    m = _KEY_LINE.fullmatch(line, indent)
    if m is None:
        raise _Unsupported
    return indent, False, _scalar(m[1]), _BELOW if m[2] is None else _value(m[2])


def _mapping(lines: list[str], i: int, indent: int) -> tuple[dict, int]:
    """The `key: value` lines at `indent` from line i: (mapping, the first line after it)."""
    out: dict = {}
    while i < len(lines):
        at, item, key, value = _line(lines[i])
        if at < indent:
            break
        if at > indent or item:
            raise _Unsupported
        if value is _BELOW:
            out[key], i = _below(lines, i + 1, indent)
        else:
            out[key], i = _fresh(value), i + 1
    return out, i


def _below(lines: list[str], i: int, indent: int) -> tuple[Any, int]:
    """The value of a `key:` line at `indent` whose value is on the lines below: a list, a mapping or null."""
    if i == len(lines):
        return None, i
    at, item, _, _ = _line(lines[i])
    if at >= indent and item:
        return _sequence(lines, i, at)
    if at > indent:
        return _mapping(lines, i, at)
    return None, i


def _sequence(lines: list[str], i: int, indent: int) -> tuple[list, int]:
    """The `- scalar` lines at `indent` from line i: (list, the first line after it)."""
    items = []
    while i < len(lines):
        at, item, _, value = _line(lines[i])
        if at < indent or (at == indent and not item):
            break
        if at > indent:
            raise _Unsupported  # a scalar continued on the next line, or a nested list
        items.append(_fresh(value))
        i += 1
    return items, i


def _fresh(value: Any) -> Any:
    return value() if value is list or value is dict else value


def _value(text: str) -> Any:
    """A value on its key's or item's line: list or dict for an empty one, else one scalar."""
    if text in _EMPTY:
        return _EMPTY[text]
    quoted = text[:1] in ("'", '"')  # PyYAML reads it whole: text after the closing quote is an error
    if (
        not text
        or text != text.strip(" ")
        or text[0] in _NOT_PLAIN_START
        or text.startswith(("- ", "---", "..."))
        or text.endswith(":")
        or (not quoted and (": " in text or " #" in text))
    ):
        raise _Unsupported
    return _scalar(text)


@functools.lru_cache(maxsize=1 << 16)
def _scalar(text: str) -> Any:
    """One scalar's text as PyYAML resolves it (`1.0e-05` a float, `null` None, `'on'` a string); remembered."""
    value = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if isinstance(value, (dict, list)):  # `'a': b` is a mapping, not a quoted scalar
        raise _Unsupported
    return value
