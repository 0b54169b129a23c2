"""The report's fast readers (issue 41 item 19) read what the general ones read: config.yaml as yaml.safe_load reads
it (rlcompare.report.block_yaml), rows as pandas frames them (rlcompare.report.frames); anything else is left to
those, and a whole report is the same either way."""

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rlcompare.report import block_yaml, build_report, frames  # noqa: E402
from rlcompare.report import load as L  # noqa: E402

# every kind of scalar PyYAML resolves, in the layout OmegaConf.to_yaml writes (and indented lists, empty values)
CONFIG = """\
seed: 3
run_name: grpo__lr=1e-5__s3
trainer:
  lr: 1.0e-05
  betas:
  - 0.9
  - 0.99
  micro_batch_size: null
  progress: true
  tags: []
  extra: {}
  steps: 1_000
rollout:
  quoted_on: 'on'
  on: off
  stop:
    - '###'
    - "a: b # c"
    - -1
  empty:
  nested:
    deeper:
      leaf: ~
notes: It's a plain, long value with [brackets] and {braces}
when: 2024-05-01
stamp: 2024-05-01 10:00:00
hex: 0x1F
octal: 017
sexagesimal: 1:20
big: 123456789012345678901234567890
inf: .inf
neg: -.inf
nan: .nan
quoted: 'it''s # not a comment'
escaped: "tab\\there \\u00e9"
url: http://x.y/z?a=1&b=2
unicode: é ü 字
yes: no
1: one
2.5: two and a half
"""


def test_block_yaml_reads_every_scalar_as_pyyaml_does():
    fast = block_yaml.read_block_yaml(CONFIG)
    assert fast is not None
    assert repr(fast) == repr(yaml.safe_load(CONFIG))  # repr: key order, True vs 1, nan, types all count


def test_block_yaml_reads_the_configs_train_writes(compose):
    from omegaconf import OmegaConf

    for overrides in ([], ["algorithm=ppo"], ["algorithm=dapo", "prompts=countdown", "verifier=countdown"]):
        text = OmegaConf.to_yaml(compose(*overrides, fast=False), resolve=True)
        fast = block_yaml.read_block_yaml(text)
        assert fast is not None, overrides
        assert repr(fast) == repr(yaml.safe_load(text))


@pytest.mark.parametrize(
    "text",
    [
        "a: [1, 2]\n",  # flow collections
        "a: {b: 1}\n",
        "a: &x 1\nb: *x\n",  # anchors and aliases
        "base: &b\n  x: 1\nc:\n  <<: *b\n",  # merge key
        "a: !!str 1\n",  # tags
        "a: |\n  text\n",  # block scalars
        "a: >\n  text\n",
        "a: a long plain value\n  continued here\n",  # a plain scalar on two lines
        "a: 'a quoted value\n  continued'\n",
        "a: 1 # a comment\n",
        "# a comment\na: 1\n",
        "a: 1\n\nb: 2\n",  # blank lines
        "a:\n\tb: 1\n",  # tabs
        "a: 1\r\nb: 2\r\n",  # other line breaks
        "a:\n- b: 1\n  c: 2\n",  # a list of mappings
        "a:\n- - 1\n",  # nested lists
        "a:\n-\n",  # a null item
        "'a b': 1\n",  # a quoted key
        "a b: 1\n",  # a key of two words
        "---\na: 1\n",  # document markers and directives
        "%YAML 1.1\n---\na: 1\n",
        "  a: 1\n",  # an indented document
        "- 1\n- 2\n",  # not a mapping
        "plain text\n",
        "",
        "a: 1\n b: 2\n",  # a bad indent: PyYAML's error, then the report's own reading
        "a: =\n",  # a scalar PyYAML refuses to construct
        "a: 2024-13-45\n",
        "a:b: 1\n",
    ],
)
def test_block_yaml_leaves_everything_else_to_pyyaml(text, tmp_path):
    assert block_yaml.read_block_yaml(text) is None
    (tmp_path / "config.yaml").write_text(text)
    try:
        expected = yaml.safe_load(text)
        expected = expected if isinstance(expected, dict) else {}
    except Exception:
        expected = L._mini_yaml(text)
    assert repr(L._read_yaml(tmp_path / "config.yaml")) == repr(expected)


def test_block_yaml_gives_each_config_its_own_lists_and_mappings():
    a, b = block_yaml.read_block_yaml(CONFIG), block_yaml.read_block_yaml(CONFIG)
    a["trainer"]["tags"].append("x")
    a["trainer"]["betas"].append(1.0)
    assert b["trainer"]["tags"] == [] and b["trainer"]["betas"] == [0.9, 0.99]


NUMBER_ROWS = [
    [{"step": 1, "tokens/generated": 10, "reward/mean": 0.5}, {"step": 2, "tokens/generated": 20, "reward/mean": 1}],
    [{"a": 1, "b": None}, {"a": 2, "b": 3}],  # ints and null: floats
    [{"a": None, "b": 1}, {"a": None, "b": 2}],  # only null
    [{"a": 2**63 - 1, "b": -(2**63)}, {"a": 1, "b": 2}],  # int64's ends
    [{"a": 2**70, "b": 1.5}, {"a": 1.5, "b": 2}],  # an int beyond int64 among floats
    [{"a": math.inf, "b": -math.inf}, {"a": math.nan, "b": 2.0}],
]
OTHER_ROWS = [
    [{"a": True}, {"a": False}],  # booleans
    [{"a": "1.5"}, {"a": 2}],  # text
    [{"a": 1}, {"b": 2}],  # keys that differ
    [{"a": 1, "b": 2}, {"b": 3, "a": 4}],  # keys in another order
    [{"a": 2**64}, {"a": 1}],  # an int beyond int64
    [{"a": 10**400}, {"a": 1.5}],  # an int beyond a float's range
    [{"a": [1]}, {"a": [2]}],
    [],
]


@pytest.mark.parametrize("rows", NUMBER_ROWS + OTHER_ROWS)
def test_rows_frame_as_pandas_frames_them(rows):
    pandas_frame = frames._rows_frame(rows)
    frame, set_aside = frames.finite_frame(rows)
    expected_set_aside = frames.set_aside_infinite(pandas_frame)
    pd.testing.assert_frame_equal(frame, pandas_frame, check_exact=True)
    assert set_aside == expected_set_aside
    assert (frames._number_table(rows) is not None) == (rows in NUMBER_ROWS)  # the fast path took the rows it should


def test_column_floats_are_read_only_copies():
    frame, _ = frames.finite_frame(NUMBER_ROWS[0])
    tokens = frames.column_floats(frame, "tokens/generated")
    assert tokens.dtype == float and tokens.tolist() == [10.0, 20.0] and not tokens.flags.writeable
    assert not np.shares_memory(tokens, frame["tokens/generated"].to_numpy())


def _write_runs(root: Path) -> None:
    """Two variants of three seeds: one of the rows files holds text and booleans, one config.yaml a list of
    mappings, one an infinite value (so that both the fast and the general readers are taken)."""
    for variant, lr in (("a", "1.0e-05"), ("b", "2.0e-05")):
        for seed in range(3):
            d = root / "sw" / f"{variant}__s{seed}"
            d.mkdir(parents=True)
            extra = "verifier:\n  components:\n  - name: x\n    weight: 1.0\n" if seed == 1 else ""
            sweep = f"sweep:\n  name: sw\n  variant: {variant}\n  reference: a\n  component: trainer.lr\n"
            (d / "config.yaml").write_text(f"seed: {seed}\ntrainer:\n  lr: {lr}\n  betas:\n  - 0.9\n{sweep}{extra}")
            (d / "summary.json").write_text('{"status": "completed"}')
            (d / "fingerprint.json").write_text('{"model": "tiny"}')
            evals = [
                f'{{"step": {k}, "tokens/generated": {100 * k}, "eval/accuracy": {0.1 * k + 0.01 * seed}}}'
                for k in range(4)
            ]
            metrics = [
                f'{{"step": {k}, "tokens/generated": {100 * k}, "reward/mean": {0.2 * k}, "length/correct_mean": '
                + ("Infinity" if (variant, seed, k) == ("b", 2, 2) else f"{10.0 * k}")
                + (', "phase": "train", "ok": true' if seed == 0 else "")
                + "}"
                for k in range(1, 4)
            ]
            (d / "eval.jsonl").write_text("\n".join(evals) + "\n")
            (d / "metrics.jsonl").write_text("\n".join(metrics) + "\n")


def test_a_report_is_the_same_with_the_fast_readers_off(tmp_path, monkeypatch):
    _write_runs(tmp_path)
    fast = build_report(tmp_path / "sw", write=False)
    monkeypatch.setattr(L, "read_block_yaml", lambda text: None)
    monkeypatch.setattr(frames, "_number_table", lambda rows: None)
    general = build_report(tmp_path / "sw", write=False)
    for key in ("headline", "summary", "differences", "runs"):
        pd.testing.assert_frame_equal(fast[key], general[key], check_exact=True)
    assert fast["flags"] == general["flags"] and fast["notes"] == general["notes"]
    assert any("infinite" in f for f in fast["flags"])  # the set-aside value is flagged either way
