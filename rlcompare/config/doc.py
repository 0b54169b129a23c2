"""docs/config.md from the schema: every key with its default and its one-line help.

The help of a key is the comment after its field in the module that defines its dataclass (rlcompare/config/schema.py
for the run's own keys, env and verifier; rlcompare/config/sections/<section>.py for the others): one place; the
schema's defaults equal conf/'s, tests/config/test_config_defaults.py. `python scripts/config_doc.py` rewrites
docs/config.md, and tests/config/test_config_doc.py fails when it is out of step (a missing key, a stale default or
help).
Torch-free: reads those modules' source with `ast` and `tokenize`.
"""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import OmegaConf

from rlcompare.config import schema as config
from rlcompare.config.sections.algorithm import section_type

HEADER = """# Config keys

Every key of `rlcompare train` (and of a sweep's overrides), its default and what it does. Generated from the
schema in `rlcompare/config/schema.py`, where each field's comment is its help: edit it there and run
`python scripts/config_doc.py` (tests/config/test_config_doc.py fails when this page is out of step). The defaults are
those of `conf/` (the default presets: algorithm=grpo, model=tiny, prompts=arithmetic, verifier=exact_match,
budget=smoke, logger=wandb); each preset in `conf/algorithm/` writes every `algorithm.*` key out but the other
surrogates' knobs under `algorithm.clip`, which come from their specs (`rlcompare/algos/surrogate_specs.py`;
docs/algorithms.md). Keys marked *operational* never change what a run computes (`rlcompare/config/operational.py`).
"""


def _comments(cls: type, sources: dict[str, dict]) -> dict[str, str]:
    """field name -> its comment, for a dataclass of the schema, read from the source of the module defining it
    (`sources`: each module's, parsed once per call of key_help)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if path is None:  # object, and classes made in code (algorithm.clip's knobs carry their help)
        return {}
    if path not in sources:
        sources[path] = _field_comments(Path(path).read_text())
    return sources[path].get(cls.__name__, {})


def _field_comments(src: str) -> dict[str, dict[str, str]]:
    """class name -> field name -> the comment after the field (without '# '), from a module's source: the first
    comment on the field's lines (`ruff format` puts the comment of a field too long for one line inside its
    parentheses, after the value)."""
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    }
    out: dict[str, dict[str, str]] = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                st.target.id: next((comments[n] for n in range(st.lineno, st.end_lineno + 1) if n in comments), "")
                for st in node.body
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
            }
    return out


def key_help(schema: type = config.RunConfig, prefix: str = "", _sources: dict | None = None) -> dict[str, str]:
    """Every leaf key of the schema (dotted) -> its help ('' when its field has no comment), in schema order."""
    sources = {} if _sources is None else _sources
    hints = get_type_hints(schema)
    out: dict[str, str] = {}
    for f in fields(schema):
        tp = section_type(config._unwrap_optional(hints.get(f.name, f.type)))
        if is_dataclass(tp):
            out.update(key_help(tp, f"{prefix}{f.name}.", sources))
        else:  # a surrogate's knob carries its help (algos/surrogate_specs.py's knob()); a schema field, its comment
            written = (own[f.name] for c in schema.__mro__ if f.name in (own := _comments(c, sources)))
            out[prefix + f.name] = f.metadata.get("help") or next(written, "")
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v if v else '""'
    return json.dumps(v)


def rows() -> list[tuple[str, str, str]]:
    """(key, default, help) for every key of the schema."""
    defaults = OmegaConf.structured(config.RunConfig)
    out = []
    for key, help_ in key_help().items():
        value = OmegaConf.select(defaults, key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        out.append((key, _fmt(value), help_))
        if key == "verifier.extra":  # then each built-in verifier's own settings, from its registration
            from rlcompare.rewards.registry import builtin_settings

            out += [(f"verifier.{k}", _fmt(d), h) for k, d, h in builtin_settings()]
        if key == "env.settings":  # then each built-in environment's knobs, from its spec
            out += _env_knob_rows()
    return out


def _env_knob_rows() -> list[tuple[str, str, str]]:
    """(env.settings.<knob>, default, '<env>: help') for the built-in environments' knobs (rlcompare/env_specs.py;
    a plug-in's, registered in this process, left out)."""
    from rlcompare import env_specs

    out = []
    for s in env_specs.builtin_specs():
        out += [(f"env.settings.{f.name}", _fmt(f.default), f.metadata.get("help", "")) for f in fields(s.settings)]
    return out


def render() -> str:
    """docs/config.md: one table per top-level section."""
    from rlcompare.config.operational import is_operational

    parts = [HEADER]
    section = None
    for key, default, help_ in rows():
        head = key.split(".")[0] if "." in key else "run"
        if head != section:
            section = head
            parts.append(f"\n## {section}\n\n| key | default | help |\n|---|---|---|")
        note = " *(operational)*" if is_operational(key) else ""
        cell = help_.replace("|", "\\|").replace("<", "&lt;")  # a table cell: <run dir> is no HTML tag
        parts.append(f"| `{key}` | `{default}` | {cell}{note} |")
    return "\n".join(parts) + "\n"
