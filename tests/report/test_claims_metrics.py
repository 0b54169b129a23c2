"""docs/claims.md quotes metrics; a metric that changes its definition must change the doc with it.

The registry below names, for every metric the doc quotes, the functions that compute it. Their code (the
syntax tree without docstrings, so comments and formatting do not count) is hashed, and docs/claims.md records
each hash in its table "Metric definitions behind these numbers". A commit that changes how a quoted metric is
computed (as 825b93c did to `policy/entropy`, `kl/ref` and the ratio metrics) fails here until the doc says
which rows it reran or marks them as from the earlier definition, and records the new hash.
"""

import ast
import hashlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "claims.md"
L, B = "rlcompare/algos/losses.py", "rlcompare/algos/batch_stats.py"
O, OT = "rlcompare/algos/offpolicy.py", "rlcompare/train/offpolicy.py"
U = "rlcompare/train/update.py"
E, R, TG = "rlcompare/train/evaluation.py", "rlcompare/train/row.py", "rlcompare/train/targets.py"
ACC = (U, "MetricsAccumulator.reduced")  # the weighted means over micro-batches
DEFINITIONS = {
    "eval/accuracy": [(E, "evaluate_greedy")],  # the greedy eval (eval.samples=0, every claim)
    "length/incorrect_mean": [(B, "length_stats")],
    "length/mean": [(B, "length_stats")],  # c15 reports it
    "policy/entropy": [(U, "_add_micro_metrics"), ACC],
    "kl/ref": [(U, "_add_micro_metrics"), ACC],
    "clip/frac_low": [(L, "_policy_metrics"), (R, "update_entries"), (U, "_add_micro_metrics"), ACC],
    "clip/frac_high": [(L, "_policy_metrics"), (R, "update_entries"), (U, "_add_micro_metrics"), ACC],
    "groups/zero_variance_frac": [(R, "batch_entries")],
    "tokens/step": [(R, "collect_entries")],
    "sampling/groups_dropped": [(R, "collect_entries")],
    # the pre-registered off-policy claims (c9-c12)
    "offpolicy/log_ratio_abs_mean": [(O, "behaviour_gap"), (OT, "gap_metrics"), (U, "_add_micro_metrics"), ACC],
    "offpolicy/geo_mask_masked_seq_frac": [(O, "geo_sequence_mask"), (OT, "apply_correction")],
    "offpolicy/decoupled_masked_frac": [(O, "decoupled_weights"), (L, "mismatch_weights"), (OT, "apply_correction")],
    # on-policy distillation (c14)
    "distill/reverse_kl": [("rlcompare/algos/distill.py", "mixed_advantages"), (TG, "TargetMaker.advantages")],
    "time/teacher_s": [(TG, "TargetMaker._teacher_logp")],
}


def _function(path: str, qualname: str) -> ast.AST:
    node = ast.parse((REPO / path).read_text())
    for part in qualname.split("."):
        node = next(
            (
                c
                for c in ast.iter_child_nodes(node)
                if isinstance(c, (ast.FunctionDef, ast.ClassDef)) and c.name == part
            ),
            None,
        )
        if node is None:
            raise AssertionError(f"{path}: no {qualname}; update DEFINITIONS in {Path(__file__).name}")
    return node


def _without_docstrings(node: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            if isinstance(body[0].value.value, str):
                n.body = body[1:] or [ast.Pass()]
    return node


def definition_hash(metric: str) -> str:
    h = hashlib.sha256()
    for path, qualname in DEFINITIONS[metric]:
        h.update(ast.dump(_without_docstrings(_function(path, qualname))).encode())
    return h.hexdigest()[:12]


def _doc_hashes() -> dict[str, str]:
    return dict(re.findall(r"^\| `([a-z_]+/[a-z_]+)` \| [^|]+ \| `([0-9a-f]{12})` \|", DOC.read_text(), re.M))


def _quoted_metrics() -> set[str]:
    text = DOC.read_text().split("## Metric definitions behind these numbers")[0]
    return {m for m in re.findall(r"`([a-z]+/[a-z_]+)`", text) if not m.startswith(("docs/", "claims/"))}


def test_every_metric_the_doc_quotes_has_a_registered_definition():
    missing = _quoted_metrics() - set(DEFINITIONS)
    assert not missing, f"docs/claims.md quotes {sorted(missing)}: add them to DEFINITIONS in {Path(__file__).name}"


@pytest.mark.parametrize("metric", sorted(DEFINITIONS))
def test_a_quoted_metrics_definition_matches_the_doc(metric):
    recorded = _doc_hashes().get(metric)
    now = definition_hash(metric)
    where = ", ".join(q for _, q in DEFINITIONS[metric])
    assert recorded == now, (
        f"{metric}: its definition ({where}) hashes to {now}, docs/claims.md records {recorded}. Rerun the claim "
        "rows that quote it (or mark them as from the earlier definition) and record the new hash in the doc"
    )


def test_the_hash_sees_a_change_of_code_but_not_of_a_docstring():
    fn = ast.parse('def f(x):\n    """doc"""\n    return x.mean()\n').body[0]
    same = ast.parse('def f(x):\n    """other words"""\n    # a comment\n    return x.mean()\n').body[0]
    changed = ast.parse('def f(x):\n    """doc"""\n    return x.sum() / len(x)\n').body[0]
    dump = lambda n: ast.dump(_without_docstrings(n))  # noqa: E731
    assert dump(fn) == dump(same) != dump(changed)
