"""The sampled held-out eval of runs with an environment (#51, eval.samples > 0): eval.samples episodes per held-out
prompt, each a success when its end is correct, reduced by the single-turn eval's estimators (rlcompare.passk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcompare.config import validate
from rlcompare.data.types import Example
from rlcompare.envs.feedback import FeedbackEnv
from rlcompare.results import read_eval_counts
from rlcompare.rewards.verifiers import build_verifier
from rlcompare.train import evaluation
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl
from rlcompare.train.trainer import TIMING_PREFIXES, Trainer

from tests.rollout.test_episodes import TOK, _ids, _run

SAMPLED = ["eval.samples=4", "eval.k=[1,2,4]"]


def test_episodes_reduce_to_pass_at_k_by_their_final_verdict_and_last_answer():
    """2 prompts x 4 feedback episodes (scripted answers): success is the episode's end, so an episode wrong first
    and right later counts; maj@k votes the episodes' last answers, not their whole text.
    3+5=8: [9, 8] right at its 2nd answer, [8] right, [9, 7, 6] and [1, 2, 3] wrong -> c = 2 of 4.
    2+2=4: [5, 3, 4] right at its 3rd answer, three [9, 9, 9] wrong -> c = 1 of 4."""
    a, b = Example("3+5=", "8"), Example("2+2=", "4")
    script = {
        0: ["9", "8", "9", "1", "5", "9", "9", "9"],
        1: {0: "8", 2: "7", 3: "2", 4: "3", 5: "9", 6: "9", 7: "9"},
        2: {2: "6", 3: "3", 4: "4", 5: "9", 6: "9", 7: "9"},
    }
    prompts = [[TOK.bos_token_id] + _ids(x.prompt) for x in (a, b)]
    _, (_, _, c) = _run(script, [FeedbackEnv() for _ in range(8)], [a] * 4 + [b] * 4, prompts, G=4)
    o = c.outcome
    assert o.correct.tolist() == [True, True, False, False, True, False, False, False]
    assert o.finals == ["8", "8", "6", "3", "4", "9", "9", "9"]
    # policy tokens, EOS included: 2 per answer
    assert c.lengths.tolist() == [4, 2, 6, 6, 6, 6, 6, 6]
    res = evaluation.prompt_results(
        [0, 1], o.finals, o.correct, c.lengths, 4, [1, 2, 4], build_verifier({"name": "exact_match"})
    )
    # maj: 3+5 votes 8, 8, 6, 3 (8 wins every k); 2+2 votes 4 | 4, 9 (a tie: the first, 4) | 4, 9, 9, 9 (9 wins)
    assert [(r.c, r.maj) for r in res] == [(2, [True, True, True]), (1, [True, True, False])]
    row = evaluation.summarize(res, [1, 2, 4])
    assert row["eval/pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert row["eval/pass@2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)  # 1 - C(4-c,2)/C(4,2)
    assert row["eval/pass@4"] == 1.0
    assert row["eval/pass^2"] == pytest.approx((1 / 6 + 0) / 2)  # C(c,2)/C(4,2)
    assert row["eval/maj@4"] == 0.5 and row["eval/maj@1"] == 1.0
    assert row["eval/tokens"] == 42 and row["eval/mean_length_correct"] == pytest.approx((4 + 2 + 6) / 3)


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_run_with_an_environment_evaluates_sampled_episodes(compose):
    """An environment whose verdict is the example's answer's parity (tests/envs/fixed_envs.py): every episode of
    a prompt ends alike, so c is 0 or n for each prompt and pass@k, for every k, is the share of held-out prompts
    with an even answer, read off the prompts themselves. Its first turn's reward 1 is not the verdict
    (env.reward=last): success is the episode's end."""
    env = ["env=feedback", "env.name=custom", "env.target=tests.envs.fixed_envs:EvenAnswer", "env.reward=last"]
    out = train(compose(*env, *SAMPLED, "budget.max_steps=1", "trainer.eval_every=1"))
    run = Path(out["run_dir"])
    counts, notes = read_eval_counts(run / "eval_counts.jsonl")
    evals = read_jsonl(run / "eval.jsonl")
    # the held-out prompts as the run drew them
    answers = [p.example.answer for p in Trainer(validate(compose(*env, *SAMPLED)), run / "probe").eval_prompts]
    even = [int(x) % 2 == 0 for x in answers]
    assert 0 < sum(even) < len(even) == 16
    assert notes == [] and [c["step"] for c in counts] == [0, 1]
    for c, e in zip(counts, evals):
        assert c["n"] == [4] * 16 and c["c"] == [4 * x for x in even]
        for k in (1, 2, 4):
            assert e[f"eval/pass@{k}"] == pytest.approx(sum(even) / 16)
        assert e["eval/samples"] == 4 and e["eval/tokens"] > 0


@pytest.mark.slow  # tens of seconds under load (issue 63: -m 'not slow' under 5 min)
def test_an_env_runs_sampled_eval_leaves_its_training_alone(compose):
    """The eval's episodes draw from the eval's streams and are not the training row's episodes: the training rows
    are those of the same run evaluated greedily only."""
    base = train(compose("env=feedback", "budget.max_steps=2", "run_name=greedy"))
    s = train(compose("env=feedback", "budget.max_steps=2", *SAMPLED, "eval.greedy=true", "run_name=sampled"))

    def rows(out):
        return [
            {k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_jsonl(Path(out["run_dir"]) / "metrics.jsonl")
        ]

    assert rows(s) == rows(base)
    evals, greedy = (read_jsonl(Path(o["run_dir"]) / "eval.jsonl") for o in (s, base))
    assert [e["eval/accuracy"] for e in evals] == [g["eval/accuracy"] for g in greedy]
    assert all(0 <= e["eval/pass@1"] <= e["eval/pass@2"] <= e["eval/pass@4"] <= 1 for e in evals)
