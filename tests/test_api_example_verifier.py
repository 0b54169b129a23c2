"""docs/api.md's worked example: examples/near_miss.py adds `verifier=near_miss` in one file (plus its
conf/verifier/near_miss.yaml); it scores, trains through the CLI's config path, and refuses bad settings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rlcompare.config.schema import ConfigError, validate
from rlcompare.results import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


def _example():
    """examples/near_miss.py, imported from its file under the name its config gives (`examples.near_miss`)."""
    if "examples.near_miss" not in sys.modules:
        spec = importlib.util.spec_from_file_location("examples.near_miss", ROOT / "examples" / "near_miss.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["examples.near_miss"] = module
        spec.loader.exec_module(module)
    return sys.modules["examples.near_miss"]


near_miss = _example()


@pytest.mark.parametrize(
    "completion, reward, correct",
    [
        ("<answer>17</answer>", 1.0, True),  # exact
        ("The answer is 18.", 0.25, False),  # off by one above: partial
        ("16", 0.25, False),  # and below
        ("<answer>15</answer>", 0.0, False),  # off by two
        ("16 or 17", 0.0, False),  # a hedge states no one number
        ("<answer>17</answer> <answer>18</answer>", 0.0, False),  # two different answers
        ("no number here", 0.0, False),
    ],
)
def test_near_miss_scores_by_hand(completion, reward, correct):
    from rlcompare.rewards.registry import build_verifier

    s = build_verifier({"name": "near_miss", "partial": 0.25}).score(completion, "17")
    assert (s.reward, s.correct, s.error) == (reward, correct, False)


def test_near_miss_scores_the_same_in_worker_processes():
    from rlcompare.rewards.pool import score_batch
    from rlcompare.rewards.registry import build_verifier

    v = build_verifier({"name": "near_miss", "partial": 0.25, "isolation": "process", "workers": 1})
    try:
        got = score_batch(v, ["17", "18", "15", "x"], ["17"] * 4, timeout_s=10.0)
    finally:
        v.close()
    assert [(s.reward, s.error) for s in got] == [(1.0, False), (0.25, False), (0.0, False), (0.0, False)]


def test_near_miss_trains_two_steps_through_the_cli_config_path(compose):
    from rlcompare.train.run import train

    cfg = compose(
        "verifier=near_miss",
        "verifier.partial=0.5",
        "budget=tiny",
        "budget.max_steps=2",
        "trainer.sample_max_chars=100000",
        "run_name=near_miss",
    )
    s = train(cfg)
    assert s["status"] == "completed" and s["steps"] == 2
    run = Path(s["run_dir"])
    rows = read_jsonl(run / "metrics.jsonl")
    n = cfg.trainer.prompts_per_step * cfg.trainer.group_size
    for r in rows:
        # each reward is 0, 0.5 or 1, and 1 exactly when correct: the batch's reward sum is the correct ones plus
        # 0.5 per near miss, whose share is the verifier's declared metric verifier/off_by_one
        total, right, near = r["reward/mean"] * n, r["accuracy/train"] * n, r["verifier/off_by_one"] * n
        assert abs(near - round(near)) < 1e-6 and abs(total - (right + 0.5 * near)) < 1e-5
    v = near_miss.NearMiss(partial=0.5)
    samples = read_jsonl(run / "samples.jsonl")
    assert samples
    for row in samples:
        assert v.score(row["completion"], row["answer"]).reward == row["reward"]
    assert json.loads(json.dumps(rows))  # plain JSON rows


@pytest.mark.parametrize(
    "override, named",
    [
        ("+verifier.partal=0.5", "verifier.partal is not a setting of verifier 'near_miss'; accepted keys: "),
        ("verifier.partial=half", "verifier.partial='half' is not accepted"),
    ],
)
def test_an_unknown_key_or_a_bad_value_is_refused_naming_the_key(compose, override, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")) as e:
        validate(compose("verifier=near_miss", override))
    assert "partial" in str(e.value)


def test_a_reward_outside_0_1_is_refused_by_the_config_check(compose):
    """NearMissSettings.check() runs where the config is checked, before torch loads and before any verifier is
    built (and again in the constructor, for a verifier built by hand)."""
    with pytest.raises(ConfigError, match=r"verifier.partial=2 is not accepted; use a reward in \[0, 1\]"):
        validate(compose("verifier=near_miss", "verifier.partial=2"))
    with pytest.raises(ValueError, match=r"verifier.partial=2 is not accepted"):
        near_miss.NearMiss(partial=2)
