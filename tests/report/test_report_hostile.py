"""rlcompare report on hostile results folders (issue 41 items 2, 11, 15): every case ends in a report or a one-line
ReportError, never a traceback, and nothing untrustworthy reaches the headline unflagged."""

import csv
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlcompare.report import build_report, main  # noqa: E402
from rlcompare.report.load import ReportError  # noqa: E402
from rlcompare.results import read_jsonl, scan_jsonl  # noqa: E402
from rlcompare.train.tracking import truncate_jsonl  # noqa: E402
from test_report import make_run  # noqa: E402

DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's JSON parser recurses


def two_seeds(root, name="a", **kw):
    for s in range(2):
        make_run(root, f"{name}_s{s}", s, [0.1, 0.2, 0.3 + 0.1 * s], **kw)
    return Path(root) / "exp"


def edit_summary(path, **fields):
    s = json.loads(path.read_text())
    s.update(fields)
    path.write_text(json.dumps(s))


def append_line(path, line):
    path.write_text(path.read_text() + line + "\n")


# ---------------------------------------------------------------- item 11: no traceback


def test_a_400_digit_integer_in_a_row_is_set_aside_and_flagged(tmp_path):
    folder = two_seeds(tmp_path)
    append_line(
        folder / "a_s0" / "eval.jsonl", '{"step": 3, "tokens/generated": 300, "eval/accuracy": ' + "9" * 400 + "}"
    )
    append_line(folder / "a_s1" / "metrics.jsonl", '{"step": 9, "tokens/generated": ' + "9" * 400 + "}")
    res = build_report(folder, write=False)
    runs = res["runs"].set_index("run")
    assert not runs.loc["a_s0", "included"]  # its compared metric held the value: not compared
    assert "infinite values in eval.jsonl: eval/accuracy" in runs.loc["a_s0", "excluded_because"]
    assert runs.loc["a_s1", "final_tokens"] == 200  # the huge token count is set aside, not the run's end
    flag = next(f for f in res["flags"] if "run(s) with infinite values" in f)
    assert "`a_s0`: eval.jsonl: eval/accuracy ×1" in flag and "`a_s1`: metrics.jsonl: tokens/generated ×1" in flag


def test_infinity_in_a_row_is_flagged_not_put_in_the_headline(tmp_path):
    folder = two_seeds(tmp_path)
    for s in range(2):
        p = folder / f"a_s{s}" / "eval.jsonl"
        p.write_text(p.read_text().replace('"eval/accuracy": 0.2', '"eval/accuracy": Infinity'))
    make_run(tmp_path, "b_s0", 0, [0.1, 0.2, 0.5])
    p = tmp_path / "exp" / "b_s0" / "metrics.jsonl"
    p.write_text(p.read_text().replace('"length/incorrect_mean": 100.0', '"length/incorrect_mean": -Infinity', 1))
    res = build_report(folder, write=False)
    head = res["headline"].set_index("variant")
    assert set(head.index) == {"b"}  # a's runs are both left out: no "inf [inf, inf]" row
    assert head.loc["b", "length_incorrect"] == 100.0  # the -inf step is set aside: the mean of the others
    assert any("`b_s0`: metrics.jsonl: length/incorrect_mean ×1" in f for f in res["flags"])


def test_a_pid_beyond_a_c_long_reads_as_no_live_process(tmp_path):
    folder = two_seeds(tmp_path)
    edit_summary(folder / "a_s0" / "summary.json", status="running", pid=2**70)
    runs = build_report(folder, write=False)["runs"].set_index("run")
    assert runs.loc["a_s0", "status"] == "partial" and "no live process" in runs.loc["a_s0", "notes"]


def test_a_seed_written_as_infinity_is_an_unknown_seed(tmp_path):
    folder = two_seeds(tmp_path)
    p = folder / "a_s0" / "summary.json"
    p.write_text(p.read_text().replace('"seed": 0', '"seed": Infinity'))
    (folder / "a_s0" / "config.yaml").write_text(
        (folder / "a_s0" / "config.yaml").read_text().replace("seed: 0", "seed: .inf")
    )
    edit_summary(p, run_name="a_x")  # no seed in the name either
    res = build_report(folder, write=False)
    assert pd.isna(res["runs"].set_index("run").loc["a_x", "seed"])
    assert any("seed unknown for `a_x`" in f for f in res["flags"])


@pytest.mark.parametrize("file", ["summary.json", "fingerprint.json", "metrics.jsonl", "eval.jsonl"])
def test_deeply_nested_json_reads_as_unreadable(tmp_path, file):
    folder = two_seeds(tmp_path)
    p = folder / "a_s0" / file
    if file.endswith(".jsonl"):
        append_line(p, '{"step": 4, "x": ' + DEEP + "}")
    else:
        p.write_text(DEEP)
    res = build_report(folder, write=False)
    notes = res["runs"].set_index("run").loc["a_s0", "notes"]
    assert ("unreadable" in notes) or ("dropped 1 unreadable line(s)" in notes) or ("dropped a torn last line" in notes)


def test_deeply_nested_json_does_not_break_the_readers_resume_uses(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n{"step": 2, "x": ' + DEEP + '}\n{"step": 3}\n')
    assert read_jsonl(p) == [{"step": 1}, {"step": 3}]
    assert scan_jsonl(p) == ([{"step": 1}, {"step": 3}], 1, False)
    assert truncate_jsonl(p, lambda row: row["step"] < 3) == 2  # the deep row and step 3
    assert p.read_text() == '{"step": 1}\n'


def test_a_folder_named_like_a_results_file(tmp_path):
    folder = two_seeds(tmp_path)
    (folder / "a_s1" / "eval.jsonl").unlink()
    (folder / "a_s1" / "eval.jsonl").mkdir()
    (folder / "a_s0" / "summary.json").unlink()
    (folder / "a_s0" / "summary.json").mkdir()
    make_run(tmp_path, "b_s0", 0, [0.1, 0.2, 0.3])
    res = build_report(folder, write=False)
    runs = res["runs"].set_index("run")
    assert "eval.jsonl is not a file" in runs.loc["a_s1", "notes"] and not runs.loc["a_s1", "included"]
    assert "summary.json unreadable" in runs.loc["a_s0", "notes"] and runs.loc["a_s0", "status"] == "partial"
    assert runs.loc["b_s0", "included"]


def test_an_output_folder_that_cannot_be_written_names_out(tmp_path, monkeypatch, capsys):
    folder = two_seeds(tmp_path)

    def read_only(self, *a, **k):  # what a read-only folder does to the first file written (root ignores chmod)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pd.DataFrame, "to_csv", read_only)
    with pytest.raises(ReportError, match=r"cannot write the report into .*Permission denied.*--out DIR"):
        build_report(folder)
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--out" in err


@pytest.mark.parametrize("where", ["run_name", "experiment"])
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_dollar_signs_in_names_are_drawn_as_written(tmp_path, where):
    for exp in ("e1", "e2"):  # two experiments: the variant names carry the experiment
        for s in range(2):
            make_run(tmp_path, f"a_s{s}", s, [0.1, 0.2, 0.3], experiment=exp)
            p = tmp_path / exp / f"a_s{s}" / "summary.json"
            edit_summary(
                p,
                **(
                    {"run_name": f"$\\frac{{a}}{{$_s{s}"}
                    if where == "run_name"
                    else {"experiment": f"$\\frac{{{exp}}}{{$"}
                ),
            )
    res = build_report(tmp_path, out_dir=tmp_path / "out")
    assert (tmp_path / "out" / "accuracy.png").exists()
    assert any("$" in v for v in res["headline"]["variant"])


# ---------------------------------------------------------------- item 15: report.csv and report.md


@pytest.mark.parametrize("start", ["=", "+", "-", "@"])
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_name_starting_like_a_formula_is_escaped_in_the_csvs(tmp_path, start):
    name = f"{start}HYPERLINK(1)"
    for s in range(2):
        make_run(tmp_path, f"x_s{s}", s, [0.1, 0.2, 0.3], variant=name)
    build_report(tmp_path / "exp", out_dir=tmp_path / "out")
    with open(tmp_path / "out" / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["variant"] == "'" + name
    with open(tmp_path / "out" / "runs.csv", newline="") as f:
        assert {r["variant"] for r in csv.DictReader(f)} == {"'" + name}
    assert float(rows[0]["final"]) == pytest.approx(0.3)  # numbers stay numbers


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_multi_line_error_keeps_report_md_on_its_rows(tmp_path):
    two_seeds(tmp_path)
    make_run(tmp_path, "b_s0", 0, [0.1], status="failed", error="Traceback:\n  line 1\n| boom |\n\nValueError: x")
    build_report(tmp_path / "exp", out_dir=tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| b_s0 |"))
    assert "Traceback: ⏎ line 1 ⏎ \\| boom \\| ⏎ ValueError: x" in row
    assert row.count(" | ") == 6  # seven cells: the error did not add columns or rows
    flag = next(line for line in md.splitlines() if "failed run(s)" in line)
    assert flag.startswith("> - ") and "ValueError: x" in flag


# ---------------------------------------------------------------- item 2: the whole config outside the component


def set_config(run_dir, **keys):
    """Add trainer.* / algorithm.* keys to a make_run config.yaml (nested under its existing sections)."""
    p = Path(run_dir) / "config.yaml"
    text = p.read_text()
    for dotted, value in keys.items():
        section, *inner, key = dotted.split(".")
        nested = "".join(f"{'  ' * (i + 1)}{k}:\n" for i, k in enumerate(inner))
        text = text.replace(f"{section}:\n", f"{section}:\n{nested}{'  ' * (len(inner) + 1)}{key}: {value}\n", 1)
    p.write_text(text)


def test_a_pair_differing_outside_its_component_in_config_yaml_is_unmatched(tmp_path):
    """Two sweeps mixed in one folder (issue 41 item 2): the base's lr differs from the variant's, which declares
    only clipping; fingerprint.json does not hold trainer.* or algorithm.*, config.yaml does."""
    for s in range(2):
        base = make_run(tmp_path, f"grpo__s{s}", s, [0.1, 0.2, 0.3], variant="grpo", component="clipping")
        var = make_run(
            tmp_path, f"clip__s{s}", s, [0.1, 0.2, 0.4], variant="clip", reference="grpo", component="clipping"
        )
        set_config(base, **{"trainer.lr": 3e-5, "algorithm.clip.eps_high": 0.2})
        set_config(var, **{"trainer.lr": 1e-5, "algorithm.clip.eps_high": 0.28})
    res = build_report(tmp_path / "exp", write=False)
    assert res["differences"].empty  # left out: unmatched
    flag = next(f for f in res["flags"] if "Unmatched: `clip` vs reference `grpo`" in f)
    assert "config.yaml trainer.lr: 1e-05 vs 3e-05" in flag
    assert "eps_high" not in flag  # inside the declared component (clipping: algorithm.clip.*)
    res = build_report(tmp_path / "exp", write=False, allow_unmatched=True)
    assert not res["differences"]["matched"].any()


def test_a_pair_differing_only_inside_its_component_or_in_operational_keys_is_matched(tmp_path):
    for s in range(2):
        base = make_run(tmp_path, f"grpo__s{s}", s, [0.1, 0.2, 0.3], variant="grpo")
        var = make_run(tmp_path, f"lr__s{s}", s, [0.1, 0.2, 0.4], variant="lr", reference="grpo", component="optimizer")
        set_config(base, **{"trainer.lr": 3e-5, "trainer.threads": 1, "trainer.progress": "true"})
        set_config(var, **{"trainer.lr": 1e-5, "trainer.threads": 4, "trainer.progress": "false"})
    res = build_report(tmp_path / "exp", write=False)
    assert not res["flags"] and res["differences"]["matched"].all()


def test_seeds_of_one_variant_differing_in_config_yaml_are_unmatched(tmp_path):
    for s in range(2):
        run = make_run(tmp_path, f"grpo__s{s}", s, [0.1, 0.2, 0.3], variant="grpo")
        set_config(run, **{"trainer.updates_per_rollout": 1 + s})
    res = build_report(tmp_path / "exp", write=False)
    flag = next(f for f in res["flags"] if "Unmatched runs within `grpo`" in f)
    assert "`grpo__s1` vs `grpo__s0`: config.yaml trainer.updates_per_rollout: 2 vs 1" in flag


# ---------------------------------------------------------------- item 17: a run that trained nothing


def test_a_runs_recorded_warning_is_flagged_and_hostile_ones_are_tamed(tmp_path):
    folder = two_seeds(tmp_path)
    edit_summary(folder / "a_s0" / "summary.json", warnings=["no update was applied:\nall 6 were skipped", 7, None])
    edit_summary(folder / "a_s1" / "summary.json", warnings="not a list")  # ignored, not a crash
    res = build_report(folder, write=False)
    flag = next(f for f in res["flags"] if "warning(s) recorded by the runs" in f)
    assert flag.startswith("**1 warning(s)") and "`a_s0`: no update was applied: all 6 were skipped" in flag
    assert "\n" not in flag and "a_s1" not in flag
    runs = res["runs"].set_index("run")
    assert "run warning: no update was applied" in runs.loc["a_s0", "notes"]


def test_a_warning_is_cut_to_one_line_of_300_characters(tmp_path):
    folder = two_seeds(tmp_path)
    edit_summary(folder / "a_s0" / "summary.json", warnings=["x" * 10_000])
    flag = next(f for f in build_report(folder, write=False)["flags"] if "warning(s)" in f)
    assert "x" * 300 in flag and "x" * 301 not in flag
