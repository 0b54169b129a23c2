"""scripts/claims_table.py: the claims table from the committed per-seed CSV (docs/claims_seeds.csv), with the
paired interval, Holm over the report's family and the MDE, worked by hand."""

import importlib.util
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _table():
    spec = importlib.util.spec_from_file_location("claims_table", REPO / "scripts" / "claims_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(claim, variant, va, vb, metric="eval/accuracy", quantity="window"):
    out = []
    for arm, vals in (("variant", va), ("reference", vb)):
        for seed, v in enumerate(vals):
            out.append(dict(claim=claim, variant=variant, reference="g8", metric=metric, quantity=quantity, arm=arm,
                            seed=seed, value=v, comparison_tokens=1e5, source="test"))  # fmt: skip
    return out


CLAIM = {
    "name": "cx",
    "base": {"label": "g8"},
    "claim": {
        "expect": [
            {"variant": "g16", "metric": "eval/accuracy", "direction": "higher"},
            {"variant": "g4", "metric": "eval/accuracy", "direction": "lower"},
        ]
    },
}
# g16 - g8 per seed: 0.03, 0.02, 0.01, 0.04, 0.00 -> paired mean 0.02, SE sqrt(5e-5), t = 2.828427, p = 0.047421
# (tests/report/test_stats_paired.py works it); g4 - g8: 0, 0.1, -0.1, 0.05, -0.05 -> mean 0, t = 0, p = 1
G8 = [0.47, 0.44, 0.47, 0.48, 0.44]
G16 = [0.50, 0.46, 0.48, 0.52, 0.44]
G4 = [0.47, 0.54, 0.37, 0.53, 0.39]


def test_the_table_uses_the_paired_interval_and_holm_over_the_reports_family():
    t = _table()
    rows = {r["variant"]: r for r in t.claim_rows(CLAIM, _rows("cx", "g16", G16, G8) + _rows("cx", "g4", G4, G8), 5)}
    g16 = rows["g16"]
    assert g16["method"] == "paired" and g16["diff"] == pytest.approx(0.02)
    assert g16["low"] == pytest.approx(0.02 - 2.776445 * math.sqrt(5e-5), abs=1e-6)
    assert g16["p"] == pytest.approx(0.047421, abs=2e-6)
    # Holm over the family of 2 (g16 and g4 against g8 on eval/accuracy): sorted p 0.047421, 1 -> 2 x 0.047421
    assert g16["p_holm"] == pytest.approx(0.094842, abs=4e-6) and g16["family"] == 2
    # the unadjusted interval excludes 0, the adjusted test does not: not "reproduced" (c7's case, issue 42)
    assert g16["low"] > 0 and g16["verdict"].startswith("inconclusive (none larger than")
    # MDE: (2.776445 + 0.940965) x sqrt(5e-5) = 0.026286
    assert g16["mde"] == pytest.approx(0.026286, abs=1e-6)
    assert "| cx | g16 vs g8 |" in t.markdown(list(rows.values()))


def test_a_claim_without_rows_says_so_and_an_identity_is_labelled():
    t = _table()
    assert t.claim_rows(CLAIM, [], 5)[0]["verdict"].startswith("pre-registered, not yet run")
    other = _rows("c_other", "g16", G8, G8)  # seeds of another claim only
    assert t.claim_rows(CLAIM, other, 5)[0]["verdict"].startswith("pre-registered, not yet run")
    # every row of a claim never run says so, its "report" rows too (not "the base arm has no such metric")
    reported = {
        **CLAIM,
        "claim": {**CLAIM["claim"], "expect": [{**e, "direction": "report"} for e in CLAIM["claim"]["expect"]]},
    }
    assert all(r["verdict"].startswith("pre-registered, not yet run") for r in t.claim_rows(reported, [], 5))
    ident = {**CLAIM, "claim": {**CLAIM["claim"], "kind": t.IDENTITY}}
    same = _rows("cx", "g16", G8, G8) + _rows("cx", "g4", G8, G8)
    r = t.claim_rows(ident, same, 5)[0]
    assert r["low"] == r["high"] == 0.0 and r["verdict"].startswith("mechanism identity")


def test_the_committed_csv_matches_the_claim_files():
    t = _table()
    rows = t.read_seeds(t.SEEDS_CSV)
    claims = {d["name"]: d for d in t._claims(REPO / "sweeps" / "claims")}
    assert rows, "docs/claims_seeds.csv is empty"
    for r in rows:
        data = claims[r["claim"]]
        assert r["variant"] in {e["variant"] for e in data["claim"]["expect"]}
        assert r["reference"] == data["base"]["label"] and r["quantity"] in ("window", "final", "auc")


def test_a_row_seeds_decide_is_fragile_naming_every_one_and_a_bimodal_arm_below_the_count_is_inconclusive():
    # issue 50, 65. g16 - g8 per seed 0.03, 0.02, 0.01, 0.04, 0.00 (p 0.047421 alone): a family of one here. Each
    # seed left out in turn, t against t(0.975, 3) = 3.182446:
    #   without seed 0: 0.02 0.01 0.04 0.00, mean 0.0175, SS 8.75e-4, SE sqrt(8.75e-4 / 12) = 0.008539, t 2.049
    #   without seed 1: 0.03 0.01 0.04 0.00, mean 0.02, SS 1e-3, SE 0.009129, t 2.191
    #   without seed 2: 0.03 0.02 0.04 0.00, mean 0.0225, SS 8.75e-4, SE 0.008539, t 2.635
    #   without seed 3: 0.03 0.02 0.01 0.00, mean 0.015, SS 5e-4, SE 0.006455, t 2.324
    #   without seed 4: 0.03 0.02 0.01 0.04, mean 0.025, SS 5e-4, SE 0.006455, t 3.873: still rejected
    # so seeds 0 to 3 each decide "reproduced", seed 4 does not
    t = _table()
    one = {**CLAIM, "claim": {"expect": [CLAIM["claim"]["expect"][0]]}}
    (g16,) = t.claim_rows(one, _rows("cx", "g16", G16, G8), 5)
    assert g16["verdict"] == "reproduced; fragile (seeds 0, 1, 2 and 3 of `g16` and `g8` each decide it)"
    # g4's seeds 0.45, 0.46, 0.44, 0.28, 0.29 have two modes (gap 0.15 / grid step 0.01 = 15 > 7.18): 5 < 15 seeds
    low = [0.45, 0.46, 0.44, 0.28, 0.29]
    rows = {r["variant"]: r for r in t.claim_rows(CLAIM, _rows("cx", "g16", G16, G8) + _rows("cx", "g4", low, G8), 5)}
    assert rows["g4"]["verdict"].startswith("inconclusive (bimodal seeds); g4: fewer than 15 seeds")
    assert math.isnan(rows["g4"]["p_holm"]) and rows["g16"]["family"] == 1  # g4 spends no alpha


def test_one_low_outlier_keeps_the_verdict_and_is_named():
    # g4 = 0.45, 0.46, 0.44, 0.45, 0.28: the gap rule sets seed 4 apart alone (ratio 16): one outlier, not two modes
    t = _table()
    low = [0.45, 0.46, 0.44, 0.45, 0.28]
    rows = {r["variant"]: r for r in t.claim_rows(CLAIM, _rows("cx", "g16", G16, G8) + _rows("cx", "g4", low, G8), 5)}
    assert rows["g4"]["bimodal"] == "" and rows["g4"]["family"] == 2
    assert rows["g4"]["verdict"].startswith("inconclusive (none larger than")
    assert "one outlier (seed 4 of `g4`)" in rows["g4"]["verdict"]


def test_the_fragile_words_list_every_seed_grouped_by_arms():
    from rlcompare.report.fragile import join, words

    assert words("seed 3 of `g4`") == "fragile (seed 3 of `g4` decides it)"
    who = join(["seed 1 of `a` and `b`", "seed 3 of `a` and `b`", "seed 2 of `c`", "seed 1 of `a` and `b`"])
    assert who == "seeds 1 and 3 of `a` and `b`; seed 2 of `c`"
    assert words(who) == "fragile (seeds 1 and 3 of `a` and `b`; seed 2 of `c` each decide it)"


def test_a_row_every_seed_of_which_sits_at_a_bound_is_untestable_and_a_final_point_holding_0_is_said():
    t = _table()
    ceiling = {**CLAIM, "claim": {"expect": [{"variant": "g16", "metric": "eval/pass@64", "direction": "same"}]}}
    (r,) = t.claim_rows(ceiling, _rows("cx", "g16", [1.0] * 5, [1.0] * 5, metric="eval/pass@64"), 5)
    assert r["verdict"] == "untestable at this ceiling: every seed of both arms at 1"
    # g16's window verdict is "reproduced"; its final point per seed 0.05, -0.02, 0.01, 0.04, 0.00: mean 0.016, the
    # interval [-0.0210, +0.0530] holds 0 (sd 0.02881, SE 0.012884, t(0.975, 4) = 2.776445)
    one = {**CLAIM, "claim": {"expect": [CLAIM["claim"]["expect"][0]]}}
    final = _rows("cx", "g16", [0.52, 0.42, 0.48, 0.52, 0.44], G8, quantity="final")
    (g16,) = t.claim_rows(one, _rows("cx", "g16", G16, G8) + final, 5)
    assert g16["final"]["low"] == pytest.approx(0.016 - 2.776445 * 0.012884, abs=1e-5) and g16["final"]["low"] < 0
    assert g16["verdict"].startswith("reproduced; the single final point's interval holds 0; fragile")


def test_the_eval_draws_of_a_sampled_pass_at_1_come_from_the_sweep_file():
    t = _table()
    c13 = {d["name"]: d for d in t._claims(REPO / "sweeps" / "claims")}["c13_passk_base_catches_up"]
    assert t.eval_draws(c13, "eval/pass@1") == 200 * 64  # conf/prompts/chain.yaml n_eval x eval.samples=64
    assert t.eval_draws(c13, "eval/pass@64") == 0 and t.eval_draws(CLAIM | {"base": {}}, "eval/pass@1") == 0


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_readme_claims_table_is_the_scripts_output_from_the_csv():
    # issue 65: one source for the headline. Regenerate with `python scripts/claims_table.py --readme`.
    t = _table()
    text = (REPO / "README.md").read_text()
    table = t.readme_table(t._claims(REPO / "sweeps" / "claims"), t.read_seeds(t.SEEDS_CSV), 5)
    assert t.replace_table(text, table) == text
    assert table.count("\n") == 2 + len(t.TITLES)  # header, rule, one row per claim
    assert "exploratory estimand (not pre-registered)" in table and "untestable at this ceiling" in table
