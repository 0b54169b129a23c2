"""`rlcompare report` on arms with degenerate runs (issue 62 point 1): a run that broke a run-health invariant at
every step is never compared, and the report names the arm and the run: one recorded as such in summary.json,
and one from before run health ("completed", its rows showing zero learning signal), re-checked from its rows."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlcompare.report import build_report  # noqa: E402
from test_report import make_run  # noqa: E402


def _rows_without_signal(run: Path) -> None:
    path = run / "metrics.jsonl"
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    path.write_text(
        "".join(json.dumps({**r, "groups/zero_variance_frac": 1.0, "reward/mean": 0.0}) + "\n" for r in rows)
    )


def test_degenerate_runs_are_left_out_and_flagged_by_arm(tmp_path):
    for s in range(3):
        make_run(tmp_path, f"grpo__s{s}", s, [0.1, 0.2, 0.3 + 0.05 * s], variant="grpo", component="algorithm")
        make_run(
            tmp_path,
            f"dapo__s{s}",
            s,
            [0.1, 0.3, 0.4 + 0.05 * s],
            variant="dapo",
            reference="grpo",
            component="algorithm",
        )
    recorded = tmp_path / "exp" / "dapo__s0" / "summary.json"
    s = json.loads(recorded.read_text())
    s.update(status="failed", error="unhealthy run: no_policy_tokens: ...")
    s["health"] = {"broken": [{"name": "no_policy_tokens", "evidence": "tokens/step = 0", "steps": 3}]}
    recorded.write_text(json.dumps(s))
    _rows_without_signal(tmp_path / "exp" / "dapo__s1")  # a run made before run health: status completed
    warned = tmp_path / "exp" / "grpo__s2" / "summary.json"  # completed under trainer.unhealthy=warn
    s = json.loads(warned.read_text())
    s["health"] = {"broken": [{"name": "no_update", "evidence": "optim/skipped_updates grew by 2", "steps": 3}]}
    warned.write_text(json.dumps(s))

    res = build_report(tmp_path / "exp", write=False)
    (flag,) = [f for f in res["flags"] if "✗ degenerate" in f]
    assert "3 run(s)" in flag and "arm `dapo`" in flag and "arm `grpo`: `grpo__s2` (no_update: " in flag
    assert "`dapo__s0` (no_policy_tokens: tokens/step = 0)" in flag
    assert "`dapo__s1` (no_learning_signal: groups/zero_variance_frac = 1, reward/mean = 0.0)" in flag
    runs = res["runs"].set_index("run")
    assert not runs.loc["dapo__s0", "included"] and not runs.loc["dapo__s1", "included"]
    assert runs.loc["dapo__s1", "status"] == "failed"
    assert runs.loc["dapo__s1", "error"].startswith("degenerate (re-checked by the report): unhealthy run: ")
    # kept by the user (trainer.unhealthy=warn): compared, and flagged above
    assert runs.loc["grpo__s2", "included"] and runs.loc["grpo__s2", "status"] == "completed"
    assert runs["included"].sum() == 4
    # the failed-runs flag does not list them again
    assert not any(f.startswith("**") and "failed run(s)" in f and "dapo__s" in f for f in res["flags"])
