"""ScaleRL's compute-performance fit inside `rlcompare report`, end to end on fabricated results folders.

Eval curves are drawn from ScaleRL's R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) with known parameters
and small noise (run folders made as tests/report/test_report.py makes them); every expected number comes from
those generating parameters, never from the fit's output.
"""

import csv
import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlcompare.report import build as R  # noqa: E402
from rlcompare.report import fit_section as F  # noqa: E402
from rlcompare.report.compute_fit import scalerl_curve  # noqa: E402
from rlcompare.report import build_report, main  # noqa: E402
from test_report import make_run  # noqa: E402

pytestmark = pytest.mark.slow  # its shared setup is seconds on 2 idle cores: out of the quick subset (issue 63)

# generating parameters: both rising arms share R0, A and C_mid; "steep" has a 4x larger efficiency B
R0, A, C_MID = 0.3, 0.7, 10_000.0
B_SLOW, B_STEEP = 1.5, 6.0
SEEDS = range(5)
NOISE = 0.01  # sd of each eval's accuracy around the curve
TOKENS = np.linspace(0.0, 40_000.0, 31)  # row 0: the step-0 eval; then an eval every ~1.3k tokens
SECONDS_PER_TOKEN = 1 / 5  # make_run writes time/elapsed_s = tokens / 5 on every eval row


def _accuracies(rng, B):
    """One seed: R0 exactly at step 0, then the curve plus noise (B=None: stuck at R0, plus noise)."""
    clean = np.full(TOKENS.size - 1, R0) if B is None else scalerl_curve(TOKENS[1:], R0, A, B, C_MID)
    acc = np.concatenate([[R0], clean + rng.normal(0.0, NOISE, TOKENS.size - 1)])
    return [float(x) for x in np.clip(acc, 0.0, 1.0)]


def _arm(root, variant, B, reference, rng, drop_step0_of=()):
    for s in SEEDS:
        tokens = [float(t) for t in TOKENS]
        d = make_run(
            root,
            f"{variant}__s{s}",
            s,
            _accuracies(rng, B),
            tokens,
            variant=variant,
            reference=reference,
            component="algorithm",
            metric_tokens=tokens[1:],
        )
        if s in drop_step0_of:  # its eval.jsonl starts at step 1: the run's R0 is unknown
            _drop_step0_eval(d / "eval.jsonl")


def _drop_step0_eval(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()][1:]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rows[0]["step"] == 1  # make_run numbers eval rows 0, 1, 2, ...


def three_arms(root):
    rng = np.random.default_rng(20)
    _arm(root, "slow", B_SLOW, None, rng)
    _arm(root, "steep", B_STEEP, "slow", rng)
    _arm(root, "stuck", None, "slow", rng)
    return Path(root) / "exp"


@pytest.fixture(scope="module")
def tokens_report(tmp_path_factory):
    folder = three_arms(tmp_path_factory.mktemp("fit"))
    return build_report(folder), folder


def _csv(path):
    with open(path, newline="") as f:
        return {r["variant"]: r for r in csv.DictReader(f)}


def _md_row(md, first_cell):
    """The cells of the markdown table row starting with first_cell."""
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r}")


def _section(md):
    start = md.index("## Compute–performance fit (ScaleRL)")
    return md[start : md.index("\n## ", start + 1)]


def _number(cell):
    return float(re.match(r"[+\-−]?[\d.,]+", cell).group(0).replace(",", "").replace("−", "-"))


@pytest.mark.slow
def test_report_section_reads_the_generating_asymptote(tokens_report):
    res, folder = tokens_report
    sec = _section((folder / "report.md").read_text())
    assert "| variant | seeds | R0 | A [95% interval] | B [interval] | C_mid (tokens) [interval] | fit |" in sec
    for v in ("slow", "steep"):
        cells = _md_row(sec, v)
        assert cells[1] == "5" and cells[2] == "0.300"  # every seed starts at R0 exactly
        # the mean of 5 seeds has noise 0.01 / sqrt(5) ~ 0.0045 per eval: A within 0.02 of the truth
        assert _number(cells[3]) == pytest.approx(A, abs=0.02)
        assert cells[6] == "✓"
    assert _md_row(sec, "stuck")[6].startswith("not identifiable: flat")
    assert "`docs/compute_fit.md`" in sec and "coverage is not claimed" in sec


def test_csv_columns_and_values_against_the_generating_parameters(tokens_report):
    _, folder = tokens_report
    arms = _csv(folder / "compute_fit.csv")
    assert set(arms) == {"slow", "steep", "stuck"}
    for column in (
        "compute",
        "seeds",
        "R0",
        "A",
        "A_low",
        "A_high",
        "B",
        "B_low",
        "B_high",
        "C_mid",
        "C_mid_low",
        "C_mid_high",
        "identifiable",
        "reason",
    ):
        assert column in arms["slow"], column
    for v, b in (("slow", B_SLOW), ("steep", B_STEEP)):
        row = arms[v]
        assert row["compute"] == "tokens" and int(row["seeds"]) == 5 and row["identifiable"] == "True"
        assert float(row["R0"]) == pytest.approx(R0, abs=1e-12)
        assert float(row["A"]) == pytest.approx(A, abs=0.02)
        assert float(row["B"]) == pytest.approx(b, rel=0.25)
        # C_mid grid: 100 log steps of ~3.8% over the observed compute, plus noise: within 10%
        assert float(row["C_mid"]) == pytest.approx(C_MID, rel=0.10)
        assert float(row["A_low"]) <= float(row["A"]) <= float(row["A_high"])
    assert arms["stuck"]["identifiable"] == "False" and arms["stuck"]["reason"].startswith("flat")


def test_delta_b_excludes_zero_for_the_steeper_arm(tokens_report):
    res, folder = tokens_report
    diffs = {(r["variant"], r["reference"]): r for r in _csv_rows(folder / "compute_fit_differences.csv")}
    assert set(diffs) == {("steep", "slow"), ("stuck", "slow")}  # the differences table's pairs
    steep = diffs[("steep", "slow")]
    assert float(steep["dB"]) == pytest.approx(B_STEEP - B_SLOW, rel=0.35)
    assert float(steep["dB_low"]) > 0  # 6.0 vs 1.5: the interval must exclude 0
    assert float(steep["dA"]) == pytest.approx(0.0, abs=0.03)  # same A generated for both
    assert steep["identifiable"] == "True"
    assert diffs[("stuck", "slow")]["identifiable"] == "False"
    sec = _section((folder / "report.md").read_text())
    cells = _md_row(sec, "steep vs slow")
    assert _number(cells[2]) > 0 and cells[3] == ""
    assert _md_row(sec, "stuck vs slow")[3].startswith("not identifiable: stuck: flat:")


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_fit_is_drawn_for_identifiable_arms_only(tokens_report):
    res, folder = tokens_report
    lines = F._fit_lines(res["compute_fit"], on_token_axis=True)
    assert set(lines) == {"slow", "steep"}  # stuck is not identifiable: no dashed curve
    for v in lines:
        x, y = lines[v]
        assert x[0] == 0.0 and y[0] == pytest.approx(R0)  # counted from the step-0 eval at 0 tokens
        # at C_mid the curve is half way: R0 + (A - R0) / 2 = 0.5, within the fit's error
        assert np.interp(C_MID, x, y) == pytest.approx(R0 + (A - R0) / 2, abs=0.03)
    # on the token axis the fit is drawn over accuracy.png's bands: no separate plot
    assert (folder / "accuracy.png").is_file() and not (folder / "compute_fit.png").exists()


@pytest.mark.slow
def test_compute_seconds_fits_against_wall_time(tmp_path, capsys):
    folder = three_arms(tmp_path / "runs")
    out = tmp_path / "out"
    assert main([str(folder), "--compute", "seconds", "--out", str(out)]) == 0
    arms = _csv(out / "compute_fit.csv")
    row = arms["slow"]
    assert row["compute"] == "seconds" and row["identifiable"] == "True"
    # seconds = tokens / 5 on every row: same A and B, C_mid = 10k tokens / 5 = 2,000 s
    assert float(row["C_mid"]) == pytest.approx(C_MID * SECONDS_PER_TOKEN, rel=0.10)
    assert float(row["A"]) == pytest.approx(A, abs=0.02)
    assert float(row["B"]) == pytest.approx(B_SLOW, rel=0.25)
    sec = _section((out / "report.md").read_text())
    assert "C_mid (s) [interval]" in sec and "`--compute seconds`" in sec
    # accuracy.png is against tokens: the seconds fit gets its own plot, its x in seconds from step 0
    assert "![compute_fit.png](compute_fit.png)" in (out / "report.md").read_text()
    fit_report = build_report(folder, compute="seconds", write=False)["compute_fit"]
    x, y = F._fit_lines(fit_report, on_token_axis=False)["slow"]
    assert np.interp(C_MID * SECONDS_PER_TOKEN, x, y) == pytest.approx(R0 + (A - R0) / 2, abs=0.03)


def test_bogus_compute_fails_before_loading_runs(tmp_path, capsys, monkeypatch):
    folder = three_arms(tmp_path / "runs")

    def must_not_load(*a, **k):
        raise AssertionError("runs were loaded before --compute was checked")

    monkeypatch.setattr(R, "find_run_dirs", must_not_load)
    assert main([str(folder), "--compute", "bogus", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--compute=bogus" in err and "tokens" in err and "seconds" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_run_without_step0_eval_is_left_out_of_the_fit_only(tmp_path):
    rng = np.random.default_rng(7)
    _arm(tmp_path, "slow", B_SLOW, None, rng, drop_step0_of=(3,))
    res = build_report(tmp_path / "exp")
    assert int(res["headline"].iloc[0]["n_seeds"]) == 5  # the run still counts in the headline
    assert int(_csv(tmp_path / "exp" / "compute_fit.csv")["slow"]["seeds"]) == 4
    sec = _section((tmp_path / "exp" / "report.md").read_text())
    assert "not the step-0 eval" in sec and "`slow__s3`" in sec


def test_fit_column_warns_when_bootstrap_refits_are_often_unidentifiable(tokens_report):
    res, _ = tokens_report
    arm = res["compute_fit"].fit.arms["slow"]
    assert (
        F._fit_verdict(dataclasses.replace(arm, boot_identifiable=0.5))
        == "✓ (only 50% of bootstrap refits identifiable)"
    )


def test_unmatched_pair_is_marked_in_the_fit_differences(tokens_report):
    res, _ = tokens_report
    unmatched = res["differences"].assign(matched=False)  # as with --allow-unmatched
    table = F._fit_differences_table(res["compute_fit"], unmatched)
    assert _md_row(table, "steep vs slow")[3] == "⚠ unmatched (see Attention)"


def _small_folder(root):
    for s in SEEDS:
        make_run(root, f"grpo__s{s}", s, [0.1, 0.2 + 0.01 * s, 0.3])
    return Path(root) / "exp"


def test_infinite_wall_time_leaves_the_run_out_of_a_seconds_fit(tmp_path):
    folder = _small_folder(tmp_path)
    path = folder / "grpo__s2" / "eval.jsonl"
    path.write_text(path.read_text().replace('"time/elapsed_s": 40.0', '"time/elapsed_s": Infinity'))
    fr = build_report(folder, compute="seconds", write=False)["compute_fit"]
    assert fr.fit.arms["grpo"].n_seeds == 4
    assert fr.notes == ["left out of the fit (time/elapsed_s not finite): `grpo__s2`"]


def test_a_fit_error_becomes_a_note_and_the_report_stands(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise ValueError("fit_arms: something the report did not check")

    monkeypatch.setattr(R.compute_fit, "fit_arms", refuse)
    folder = _small_folder(tmp_path)
    (folder / "compute_fit.csv").write_text("variant,A\nold,0.9\n")  # from an earlier report
    res = build_report(folder)
    assert res["compute_fit"].fit is None and len(res["headline"]) == 1
    assert res["compute_fit"].notes == ["fit not computed: fit_arms: something the report did not check"]
    sec = _section((tmp_path / "exp" / "report.md").read_text())
    assert "Not fitted (see the note below)." in sec and "- fit not computed: fit_arms: something" in sec
    assert (folder / "compute_fit.csv").read_text().strip() == ""  # the earlier rows do not survive


def test_short_curves_are_not_identifiable(tmp_path):
    # three evals (0, 100, 200 tokens): two points after step 0, fewer than the fit's 3 parameters + 2
    res = build_report(_small_folder(tmp_path))
    arm = res["compute_fit"].fit.arms["grpo"]
    assert not arm.fit.identifiable and arm.fit.reason.startswith("too few points")
    cells = _md_row(_section((tmp_path / "exp" / "report.md").read_text()), "grpo")
    assert cells[3] == "—" and cells[6].startswith("not identifiable: too few points")
    assert "grpo" not in F._fit_lines(res["compute_fit"], on_token_axis=True)
