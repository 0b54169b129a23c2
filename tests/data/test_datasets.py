"""Prompt sets from files, the hub (faked) and the Countdown generator: formats, fields, extraction, templates,
deterministic splits, and the error messages that stop a bad config before training."""

import json
import sys
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlcompare.data import datasets  # noqa: E402
from rlcompare.config import PromptsConfig  # noqa: E402
from rlcompare.rewards.countdown_expr import decode_countdown  # noqa: E402
from rlcompare.data.prompts import build_prompts  # noqa: E402
from rlcompare.rewards.verifiers import build_verifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def cfg(**kw):
    """A schema-typed prompts config (unknown keys fail like in a real run)."""
    return OmegaConf.merge(OmegaConf.structured(PromptsConfig), OmegaConf.create(kw))


def conf_file(name, **kw):
    return OmegaConf.merge(
        OmegaConf.structured(PromptsConfig), OmegaConf.load(ROOT / f"conf/prompts/{name}.yaml"), OmegaConf.create(kw)
    )


def gsm8k(path="gsm8k_sample.jsonl", **kw):
    base = dict(
        name="gsm8k",
        kind="file",
        path=str(DATA / path),
        answer_extractor="gsm8k",
        n_train=0,
        n_eval=100,
        eval_fraction=0.2,
    )
    return cfg(**{**base, **kw})


# ---------------------------------------------------------------- files
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_gsm8k_sample_in_each_format(fmt):
    s = datasets.build(gsm8k(f"gsm8k_sample.{fmt}"))
    assert (len(s.train), len(s.eval)) == (16, 4)
    every = s.train + s.eval
    assert all(ex.answer.lstrip("-").isdigit() for ex in every)  # the text after ####
    assert {ex.answer for ex in every} >= {"8", "48", "2000", "1820"}  # "1,250 + 750": #### 2000
    assert all(ex.prompt.endswith("?") for ex in every)  # template "{question}"


def test_formats_give_identical_splits():
    ref = datasets.build(gsm8k("gsm8k_sample.jsonl"))
    for fmt in ("csv", "parquet"):
        s = datasets.build(gsm8k(f"gsm8k_sample.{fmt}"))
        assert [(e.prompt, e.answer) for e in s.train] == [(e.prompt, e.answer) for e in ref.train]
        assert s.eval_hash() == ref.eval_hash()


def test_json_list_file(tmp_path):
    rows = [json.loads(line) for line in (DATA / "gsm8k_sample.jsonl").read_text().splitlines()]
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"data": rows}))
    assert len(datasets.build(gsm8k(str(p))).train) == 16


def test_math_sample_boxed_extraction():
    s = datasets.build(
        cfg(
            name="math",
            kind="file",
            path=str(DATA / "math_sample.jsonl"),
            answer_extractor="boxed",
            fields={"question": "problem", "answer": "solution"},
            template="boxed",
            n_train=0,
            n_eval=100,
        )
    )
    answers = {ex.answer for ex in s.train + s.eval}
    assert {"\\frac{5}{6}", "5\\sqrt{2}", "\\frac{\\sqrt{2}}{2}", "\\{1,2,3\\}", "(-2, 2)", "9\\pi"} <= answers
    assert all("\\boxed{}" in ex.prompt for ex in s.train)
    # the references are usable by math_verify (a model answer in another but equal form is accepted)
    v = build_verifier({"name": "math_verify"})
    assert v.score("so the answer is \\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}").correct


@pytest.mark.parametrize(
    "raw, extractor, expected",
    [
        ("work\n#### 1,000", "gsm8k", "1000"),
        ("#### 42 ", "gsm8k", "42"),
        ("so $\\boxed{\\frac{a}{b}}$ and \\boxed{\\frac{\\sqrt{2}}{2}}.", "boxed", "\\frac{\\sqrt{2}}{2}"),
        ("\\boxed{\\{1,2\\}}", "boxed", "\\{1,2\\}"),
        (" 7 ", "none", "7"),
        (42, "none", "42"),
        (42.0, "none", "42"),
        ("no marker", "gsm8k", None),
        ("no box", "boxed", None),
    ],
)
def test_extract_answer(raw, extractor, expected):
    assert datasets.extract_answer(raw, extractor) == expected


# ---------------------------------------------------------------- splits, caps, determinism
def test_split_is_deterministic_disjoint_and_seeded():
    a, b = datasets.build(gsm8k()), datasets.build(gsm8k())
    assert [e.prompt for e in a.train] == [e.prompt for e in b.train] and a.eval_hash() == b.eval_hash()
    assert not {e.prompt for e in a.train} & {e.prompt for e in a.eval}
    c = datasets.build(gsm8k(data_seed=1))
    assert [e.prompt for e in c.train] != [e.prompt for e in a.train]
    assert {e.prompt for e in c.train + c.eval} == {e.prompt for e in a.train + a.eval}


def test_caps_do_not_move_rows_across_the_split():
    full = datasets.build(gsm8k())
    capped = datasets.build(gsm8k(n_train=5, n_eval=2))
    assert [e.prompt for e in capped.train] == [e.prompt for e in full.train][:5]
    assert [e.prompt for e in capped.eval] == [e.prompt for e in full.eval][:2]
    no_frac = datasets.build(gsm8k(eval_fraction=0.0, n_eval=3))  # eval_fraction 0: hold out n_eval rows
    assert (len(no_frac.train), len(no_frac.eval)) == (17, 3)


def test_eval_path_is_a_separate_split_and_its_prompts_leave_training(tmp_path):
    """A separate eval file that repeats train prompts: they are held out only (main trained on them too)."""
    held = tmp_path / "held.jsonl"
    held.write_text("".join((DATA / "gsm8k_sample.jsonl").read_text().splitlines(keepends=True)[:5]))
    with pytest.warns(UserWarning, match=r"5 prompt\(s\) are also in the eval set \(prompts.eval_path="):
        s = datasets.build(gsm8k(eval_path=str(held)))
    assert (len(s.train), len(s.eval)) == (15, 5)
    assert not {e.prompt for e in s.train} & {e.prompt for e in s.eval}


def test_templates_named_and_literal():
    r1 = datasets.build(gsm8k(template="r1"))
    assert all(e.prompt.endswith("Assistant: <think>") and "<answer>" in e.prompt for e in r1.train)
    lit = datasets.build(
        gsm8k(template="Q: {question}\nA: {not a placeholder} \\boxed{}", chat=True, system_prompt="Be brief.")
    )
    assert lit.train[0].prompt.startswith("Q: ") and lit.train[0].prompt.endswith("A: {not a placeholder} \\boxed{}")
    assert lit.chat is True and lit.system_prompt == "Be brief."
    with pytest.raises(ValueError, match=r"prompts.template='fancy'.*plain, boxed, r1, r1_chat"):
        datasets.build(gsm8k(template="fancy"))


def test_build_prompts_dispatches_file_kind():
    s = build_prompts(gsm8k())
    assert len(s.train) == 16


# ---------------------------------------------------------------- errors before training
def test_missing_file():
    with pytest.raises(ValueError, match=r"prompts.path='nope/x.jsonl': file not found"):
        datasets.build(cfg(kind="file", path="nope/x.jsonl"))
    with pytest.raises(ValueError, match=r"prompts.eval_path='nope.csv': file not found"):
        datasets.build(gsm8k(eval_path="nope.csv"))
    with pytest.raises(ValueError, match="prompts.path is not set"):
        datasets.build(cfg(kind="file"))


def test_missing_field_names_file_field_and_columns():
    path = str(DATA / "math_sample.jsonl")
    with pytest.raises(
        ValueError,
        match=(
            r"prompts.path='.*math_sample.jsonl': field 'question' \(prompts.fields.question\) "
            r"not found; columns are: problem, solution, level, type"
        ),
    ):
        datasets.build(cfg(kind="file", path=path))
    with pytest.raises(ValueError, match=r"field 'answer' \(prompts.fields.answer\) not found"):
        datasets.build(cfg(kind="file", path=path, fields={"question": "problem", "answer": "answer"}))


def test_missing_field_in_a_later_row(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"question": "a", "answer": "1"}\n{"question": "b"}\n')
    with pytest.raises(ValueError, match=r"field 'answer' \(prompts.fields.answer\) not found in line 2"):
        datasets.build(cfg(kind="file", path=str(p)))


def test_empty_split(tmp_path):
    p = tmp_path / "one.jsonl"
    p.write_text('{"question": "a", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"prompts.path='.*one.jsonl': the train split is empty"):
        datasets.build(cfg(kind="file", path=str(p)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty.jsonl.*the eval split is empty"):
        datasets.build(
            cfg(kind="file", path=str(DATA / "gsm8k_sample.jsonl"), eval_path=str(empty), answer_extractor="gsm8k")
        )


def test_extractor_finds_nothing(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"question": "a", "answer": "no hashes"}\n' * 3)
    with pytest.raises(ValueError, match=r"line 1: prompts.answer_extractor=gsm8k found no ####"):
        datasets.build(cfg(kind="file", path=str(p), answer_extractor="gsm8k"))
    with pytest.raises(ValueError, match="prompts.answer_extractor='regex'"):
        datasets.build(cfg(kind="file", path=str(p), answer_extractor="regex"))


def test_bad_files(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl': line 2 is not valid JSON"):
        datasets.build(cfg(kind="file", path=str(bad)))
    txt = tmp_path / "x.txt"
    txt.write_text("hi")
    with pytest.raises(ValueError, match=r"unknown file type '.txt'"):
        datasets.build(cfg(kind="file", path=str(txt)))
    with pytest.raises(ValueError, match="prompts.kind='sql'"):
        datasets.build(types.SimpleNamespace(kind="sql"))


# ---------------------------------------------------------------- hub (no network: a fake `datasets` module)
class _FakeDS:
    def __init__(self, rows):
        self.rows = rows

    def to_list(self):
        return list(self.rows)


def test_hf_kind_with_a_fake_datasets_module(monkeypatch):
    rows = [json.loads(line) for line in (DATA / "gsm8k_sample.jsonl").read_text().splitlines()]
    calls = []

    def load_dataset(hf_id, config, split):
        calls.append((hf_id, config, split))
        return _FakeDS(rows[:15] if split == "train" else rows[15:])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    s = datasets.build(conf_file("gsm8k"))
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert (len(s.train), len(s.eval)) == (15, 5)
    assert all("\\boxed{}" in e.prompt for e in s.train)  # gsm8k.yaml: template boxed
    one = datasets.build(conf_file("gsm8k", eval_split=None, eval_fraction=0.2))  # no eval split: hold out
    assert (len(one.train), len(one.eval)) == (12, 3)


def test_hf_kind_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ValueError, match=r"pip install datasets.*prompts.kind=file prompts.path="):
        datasets.build(conf_file("gsm8k"))
    with pytest.raises(ValueError, match="prompts.hf_id"):
        datasets.build(cfg(kind="hf"))


# ---------------------------------------------------------------- countdown
def test_countdown_generator_is_deterministic_solvable_and_disjoint():
    c = conf_file("countdown", n_train=300, n_eval=50)
    a, b = datasets.build(c), datasets.build(c)
    assert [e.answer for e in a.train] == [e.answer for e in b.train] and a.eval_hash() == b.eval_hash()
    assert (len(a.train), len(a.eval)) == (300, 50)
    assert datasets.build(conf_file("countdown", n_train=300, n_eval=50, data_seed=1)).eval_hash() != a.eval_hash()
    keys = lambda xs: {(tuple(sorted(e.meta["nums"])), e.meta["target"]) for e in xs}  # noqa: E731
    assert not keys(a.train) & keys(a.eval)
    exactly_once = build_verifier({"name": "countdown", "require_all": True})
    for e in a.train[:100] + a.eval:
        nums, target = decode_countdown(e.answer)
        assert 3 <= len(nums) <= 4 and all(1 <= n <= 99 for n in nums) and 1 <= target <= 100
        assert exactly_once.score(f"<answer>{e.meta['solution']}</answer>", e.answer).correct
        assert e.prompt.endswith("Assistant: <think>") and str(nums) in e.prompt


def test_countdown_generator_settings():
    s = datasets.build(
        cfg(
            kind="countdown",
            n_train=20,
            n_eval=5,
            min_numbers=2,
            max_numbers=2,
            max_number=9,
            max_target=50,
            template="plain",
        )
    )
    assert all(len(e.meta["nums"]) == 2 and max(e.meta["nums"]) <= 9 for e in s.train)
    assert s.train[0].prompt.startswith("Using the numbers")
    with pytest.raises(ValueError, match="prompts.n_train > 0"):
        datasets.build(cfg(kind="countdown", n_train=0, n_eval=5))
    with pytest.raises(ValueError, match="distinct puzzles"):
        datasets.build(
            cfg(kind="countdown", n_train=500, n_eval=5, min_numbers=2, max_numbers=2, max_number=3, max_target=9)
        )


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_countdown_from_file(tmp_path, fmt):
    import pandas as pd

    path = DATA / "countdown_sample.jsonl"
    if fmt != "jsonl":
        df = pd.read_json(path, lines=True)
        path = tmp_path / f"cd.{fmt}"
        df.assign(nums=df.nums.map(json.dumps)).to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
    s = datasets.build(conf_file("countdown_file", path=str(path)))
    assert (len(s.train), len(s.eval)) == (16, 4)
    nums, target = decode_countdown(s.train[0].answer)
    assert s.train[0].meta["nums"] == nums and str(target) in s.train[0].prompt


def test_countdown_file_missing_field(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"numbers": [1, 2], "target": 3}\n' * 5)
    with pytest.raises(
        ValueError, match=r"field 'nums' \(prompts.fields.nums\) not found; columns are: numbers, target"
    ):
        datasets.build(cfg(kind="countdown", path=str(p)))


@pytest.mark.parametrize("name", ["gsm8k", "math", "countdown", "countdown_file", "arithmetic"])
def test_conf_files_fit_the_schema(name):
    c = conf_file(name)
    assert c.name == name and c.kind in ("arithmetic", "countdown", "file", "hf")


def test_empty_value_names_the_row(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"question": "a", "answer": "1"}\n{"question": "", "answer": "2"}\n' * 2)
    with pytest.raises(ValueError, match=r"line 2: field 'question' \(prompts.fields.question\) is empty"):
        datasets.build(cfg(kind="file", path=str(p)))


# ---------------------------------------------------------------- hostile files (issue #41): file and line named
def test_csv_record_with_more_or_fewer_fields_than_its_header_names_the_line(tmp_path):
    """pandas took a first record with one field more as an index and shifted every column (the answer read
    'q1')."""
    p = tmp_path / "extra.csv"
    for body, line, n in (("q1,1,x\nq2,2\n", 2, 3), ("q1,1\nq2,2,x\n", 3, 3), ("q1,1\nq2\n", 3, 1)):
        p.write_text("question,answer\n" + body)
        with pytest.raises(
            ValueError, match=rf"extra.csv': line {line} has {n} fields but the header \(line 1\) has 2"
        ):
            datasets.build(cfg(kind="file", path=str(p)))
    p.write_text('question,answer\n"a question\non two lines",1\n"q, with a comma",2\n\nq3,3\n')
    rows = datasets.read_rows(str(p))
    assert rows.rows[1] == {"question": "q, with a comma", "answer": "2"} and rows.lines == [2, 4, 6]
    p.write_text("question,question\nq1,1\n")
    with pytest.raises(ValueError, match=r"line 1: the header names column 'question' twice"):
        datasets.build(cfg(kind="file", path=str(p)))


@pytest.mark.parametrize(
    "row, what",
    [
        ('{"nums": [3.7, 5, 7], "target": 22}', r"field 'nums' .* holds a float \(3.7\)"),
        ('{"nums": [true, 5, 7], "target": 22}', r"field 'nums' .* holds a bool \(True\)"),
        ('{"nums": ["3", "x", 7], "target": 22}', r"field 'nums' .* holds a str \('x'\)"),
        ('{"nums": [3, 5, 7], "target": 22.5}', r"field 'target' .* is a float \(22.5\)"),
        ('{"nums": [3, 5, 7], "target": true}', r"field 'target' .* is a bool \(True\)"),
        ('{"nums": [3, 5, 7], "target": "22.0"}', r"field 'target' .* is a str \('22.0'\)"),
        ('{"nums": [3, 5, 10000000], "target": 22}', r"field 'nums' .* holds an int \(10000000\)"),
        ('{"nums": 7, "target": 22}', r"field 'nums' .* holds an int \(7\)"),
    ],
)
def test_countdown_file_refuses_numbers_that_are_not_whole(tmp_path, row, what):
    """int() turned 3.7 into 3 and true into 1: a different puzzle than the file's, silently."""
    p = tmp_path / "cd.jsonl"
    p.write_text('{"nums": [1, 2], "target": 3}\n' + row + "\n")
    with pytest.raises(ValueError, match=rf"cd.jsonl': line 2: {what}"):
        datasets.build(cfg(kind="countdown", path=str(p)))


def test_countdown_file_reads_whole_numbers_in_any_spelling(tmp_path):
    p = tmp_path / "cd.csv"
    p.write_text('nums,target\n"[3.0, 5, 7]",22\n"[1, 2]", 3 \n"[2, 4]",8\n')
    s = datasets.build(cfg(kind="countdown", path=str(p), eval_fraction=0.34))
    assert sorted(decode_countdown(e.answer) for e in s.train + s.eval) == [([1, 2], 3), ([2, 4], 8), ([3, 5, 7], 22)]


HOSTILE_VALUES = {  # a value on line 3 of the file -> what the error says
    "not_utf8": (b"\xff\xfe", r"line 3 is not UTF-8 text \(byte 0xff\); save the file as UTF-8"),
    "long_integer": (b"9" * 5000, r"line 3 holds an integer longer than 4300 digits"),
    "deep_json": (b"[" * 5000 + b"]" * 5000, r"line 3: JSON nested more than 100 levels deep"),
}


@pytest.mark.parametrize(  # a CSV field is text: only its bytes can be wrong
    "ext, case", [(e, c) for e in ("jsonl", "json") for c in HOSTILE_VALUES] + [("csv", "not_utf8")]
)
def test_prompt_file_errors_name_the_file_and_the_line(tmp_path, ext, case):
    """Each used to end in a bare UnicodeDecodeError / ValueError / RecursionError naming neither."""
    bad, message = HOSTILE_VALUES[case]
    first, second = b'{"question": "a", "answer": "1"}', b'{"question": "b", "answer": ' + bad + b"}"
    body = {
        "jsonl": b"\n".join([first, b"", second]) + b"\n",
        "json": b"[\n" + first + b",\n" + second + b"]\n",
        "csv": b"question,answer\na,1\nb," + bad + b"\n",
    }[ext]
    p = tmp_path / f"f.{ext}"
    p.write_bytes(body)
    with pytest.raises(ValueError, match=rf"prompts.path='.*f.{ext}': {message}"):
        datasets.build(cfg(kind="file", path=str(p)))


@pytest.mark.parametrize(
    "value, kind",
    [('{"a": 1}', r"a dict \(\{'a': 1\}\)"), ("[1, 2]", r"a list \(\[1, 2\]\)"), ("true", r"a bool \(True\)")],
)
@pytest.mark.parametrize("field", ["answer", "question"])
def test_wrong_typed_questions_and_answers_are_refused(tmp_path, value, kind, field):
    """A dict answer was stringified ("{'a': 1}"): a reference no completion can state."""
    other = "question" if field == "answer" else "answer"
    p = tmp_path / "x.jsonl"
    p.write_text(f'{{"question": "q", "answer": 1}}\n{{"{other}": "2", "{field}": {value}}}\n')
    with pytest.raises(
        ValueError, match=rf"x.jsonl': line 2: field '{field}' .* is {kind}; it must be text or a number"
    ):
        datasets.build(cfg(kind="file", path=str(p)))


def test_repeated_prompts_warn_and_never_reach_both_sides_of_the_split(tmp_path):
    """Ten prompts three times each: main held out copies of prompts it also trained on."""
    p = tmp_path / "dup.jsonl"
    p.write_text("".join(f'{{"question": "q{i}", "answer": "{i}"}}\n' for _ in range(3) for i in range(10)))
    with pytest.warns(
        UserWarning, match=r"dup.jsonl': 20 row\(s\) repeat an earlier prompt \(line 11 repeats line 1\)"
    ):
        s = datasets.build(cfg(kind="file", path=str(p), eval_fraction=0.3))
    prompts = [e.prompt for e in s.train + s.eval]
    assert sorted(prompts) == sorted(f"q{i}" for i in range(10)) and (len(s.train), len(s.eval)) == (7, 3)
    cd = tmp_path / "cd.jsonl"  # the same puzzle with its numbers in another order is the same prompt
    cd.write_text(
        '{"nums": [3, 5, 7], "target": 22}\n{"nums": [7, 3, 5], "target": 22}\n{"nums": [1, 2], "target": 3}\n'
    )
    with pytest.warns(UserWarning, match=r"1 row\(s\) repeat an earlier prompt \(line 2 repeats line 1\)"):
        s = datasets.build(cfg(kind="countdown", path=str(cd), eval_fraction=0.5))
    assert (len(s.train), len(s.eval)) == (1, 1)
