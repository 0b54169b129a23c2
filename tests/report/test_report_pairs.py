"""The report's comparisons (issue 42, issue 41 item 10): each pair at its own comparison point, seeds paired
where the arms share them, smoothed estimands, one run per seed, MDE, bimodal flags, physical bounds."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlcompare.report import build_report  # noqa: E402
from rlcompare.report.compare import NO_DIFFERENCE  # noqa: E402
from tests.report.test_report import make_run  # noqa: E402

T5 = (0, 100, 200, 300, 400)


def _pair(d, variant, quantity="window"):
    return d[(d["variant"] == variant) & (d["quantity"] == quantity)].iloc[0]


def test_an_unrelated_short_arm_does_not_move_a_pair(tmp_path):
    # base and better end at 400 tokens; a third arm ends at 200. Before: every pair was cut at the folder's
    # shortest run (200 tokens), so adding the short arm moved better-vs-base from its value at 400 to that at 200.
    for s in range(3):
        make_run(tmp_path, f"base__s{s}", s, [0.1, 0.2, 0.3, 0.4, 0.5 + 0.01 * s], T5, variant="base")
        make_run(
            tmp_path, f"better__s{s}", s, [0.1, 0.2, 0.3, 0.6, 0.8 + 0.01 * s], T5, variant="better", reference="base"
        )
    alone = build_report(tmp_path, write=False, min_seeds=3)["differences"]
    for s in range(3):
        make_run(tmp_path, f"short__s{s}", s, [0.1, 0.2, 0.3], (0, 100, 200), variant="short", reference="base")
    with_short = build_report(tmp_path, write=False, min_seeds=3)["differences"]
    for d in (alone, with_short):
        f = _pair(d, "better", "final")
        assert f["comparison_tokens"] == 400 and f["diff"] == pytest.approx(0.3)  # 0.8 + .01 s - (0.5 + .01 s)
    assert _pair(with_short, "short", "final")["comparison_tokens"] == 200


def test_window_is_the_mean_of_the_last_three_evals_and_the_verdict_is_paired(tmp_path):
    # per seed: base's last three evals 0.3, 0.4, 0.5 (+0.02 s); better's 0.3, 0.5, 0.6 (+0.02 s): window
    # means 0.4 + 0.02 s and 0.4667 + 0.02 s, a difference of 0.0667 on every seed -> paired: zero width
    for s in range(5):
        k = 0.02 * s
        make_run(tmp_path, f"base__s{s}", s, [0.1, 0.2, 0.3 + k, 0.4 + k, 0.5 + k], T5, variant="base")
        make_run(
            tmp_path, f"better__s{s}", s, [0.1, 0.2, 0.3 + k, 0.5 + k, 0.6 + k], T5, variant="better", reference="base"
        )
    d = build_report(tmp_path, write=False)["differences"]
    w = _pair(d, "better")
    assert w["method"] == "paired" and w["diff"] == pytest.approx(0.2 / 3)
    assert w["diff_low"] == pytest.approx(0.2 / 3) and w["verdict"] == "better"
    # Welch ignores the pairing: both arms spread like 0.02 s (sd 0.031623), SE = sqrt(2 x 0.001 / 5) = 0.02,
    # df = 8, t = 2.306004: 0.066667 - 0.046120 = 0.020547
    assert w["welch_low"] == pytest.approx(0.2 / 3 - 2.306004 * 0.02, abs=1e-6)


def test_no_detectable_difference_says_how_small_an_effect_could_have_been_seen(tmp_path):
    rng = np.random.default_rng(0)
    for s in range(5):
        a, b = rng.normal(0.45, 0.01, 2)
        make_run(tmp_path, f"base__s{s}", s, [0.1, 0.2, a], variant="base")
        make_run(tmp_path, f"other__s{s}", s, [0.1, 0.2, b], variant="other", reference="base")
    res = build_report(tmp_path, write=True, out_dir=tmp_path / "out")
    f = _pair(res["differences"], "other", "final")
    assert f["verdict"] == NO_DIFFERENCE and f["mde"] > 0
    assert (
        f"none larger than {_pair(res['differences'], 'other')['mde']:.3g}"
        in (tmp_path / "out" / "report.md").read_text()
    )


def test_bimodal_seeds_are_flagged_beside_the_verdict(tmp_path):
    finals = [0.45, 0.46, 0.44, 0.45, 0.28]  # seed 4 collapsed: the gap rule (16 >= 7.18 at 5 seeds)
    for s, f in enumerate(finals):
        make_run(tmp_path, f"base__s{s}", s, [0.1, 0.3, 0.45 + 0.001 * s], variant="base")
        make_run(tmp_path, f"g4__s{s}", s, [0.1, f, f], variant="g4", reference="base")
    res = build_report(tmp_path, write=True, out_dir=tmp_path / "out")
    assert _pair(res["differences"], "g4", "final")["bimodal"] == "g4"
    assert "bimodal seeds (g4): run more seeds" in (tmp_path / "out" / "report.md").read_text()


def test_one_run_per_seed_and_the_duplicate_is_named(tmp_path):
    # issue 41 item 10: `x_s0` and `x_s0-2` are one seed; counting both gave a zero-width interval from one seed
    make_run(tmp_path, "only__s0", 0, [0.1, 0.2, 0.3], variant="only")
    make_run(tmp_path, "only__s0-2", 0, [0.1, 0.2, 0.3], variant="only")
    res = build_report(tmp_path, write=False)
    h = res["headline"].iloc[0]
    assert h["n_seeds"] == 1 and np.isnan(h["final_low"])
    runs = res["runs"].set_index("run")
    why = runs.loc["only__s0-2", "excluded_because"]
    assert "seed 0 again" in why and "`only__s0`" in why
    assert any("only__s0-2" in n and "repeats seed 0" in n for n in res["notes"])


def test_bounded_quantities_get_bounded_intervals(tmp_path):
    # accuracies 0.6, 0.9, 1.0: mean 0.8333, t interval to 1.21 (issue 41: "accuracy 1.217"); cut at 1 and marked
    for s, f in enumerate([0.6, 0.9, 1.0]):
        make_run(tmp_path, f"hi__s{s}", s, [0.1, 0.5, f], variant="hi")
    res = build_report(tmp_path, write=True, out_dir=tmp_path / "out")
    h = res["headline"].iloc[0]
    assert h["final_high"] == 1.0 and bool(h["final_clipped"])
    assert h["wall_time_s_low"] >= 0 and h["tokens_per_s_low"] >= 0
    assert "✂" in (tmp_path / "out" / "report.md").read_text()
