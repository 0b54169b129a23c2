"""A verifier's declared metrics (#64): what a scoring reports travels from the worker processes, an undeclared
name is refused naming it, and the row's verifier/<name> is the mean over the scorings that reported it."""

from __future__ import annotations

import math

import pytest
import torch

from rlcompare.algos.batch_stats import reported_means
from rlcompare.rewards.pool import Score, score_batch
from rlcompare.rewards.registry import build_verifier, metric_table

COUNTDOWN = '{"nums": [3, 5, 7], "target": 22}'
MIX = {"name": "weighted", "components": [{"name": "countdown", "weight": 1.0}, {"name": "format", "weight": 0.1}]}


def test_the_mean_counts_only_the_scorings_that_reported_it():
    # by hand: column 0 reported by rows 0 and 1: (1 + 4) / 2 = 2.5; column 1 by row 2 alone: 0.5; column 2 by none
    nan = math.nan
    table = torch.tensor([[1.0, nan, nan], [4.0, nan, nan], [nan, 0.5, nan]])
    assert reported_means(table) == [2.5, 0.5, None]


def test_a_name_the_verifier_does_not_declare_is_refused():
    scores = [Score(1.0, True, metrics={"a": 2.0}), Score(0.0, False)]
    assert metric_table(scores, ("a", "b"), "mine")[0] == [2.0, pytest.approx(math.nan, nan_ok=True)]
    assert all(math.isnan(x) for x in metric_table(scores, ("a", "b"), "mine")[1])
    with pytest.raises(
        ValueError, match=r"verifier 'mine' reported metric 'a', which it does not declare \(declared: b\)"
    ):
        metric_table(scores, ("b",), "mine")


def test_weighted_metrics_come_back_from_worker_processes():
    """The worker's JSON reply carries the metrics: the same as scored inline (countdown right, R1 form missing:
    countdown 1, format 0; the reward 1 x 1 + 0.1 x 0 = 1)."""
    texts = ["<answer>3*5+7</answer>", "<think>x</think><answer>3*5+8</answer>"]
    v = build_verifier({**MIX, "isolation": "process", "workers": 1})
    try:
        got = score_batch(v, texts, [COUNTDOWN] * 2, timeout_s=10.0)
    finally:
        v.close()
    assert [(s.reward, s.metrics) for s in got] == [
        (1.0, {"countdown": 1.0, "format": 0.0}),
        (0.1, {"countdown": 0.0, "format": 1.0}),
    ]
    inline = build_verifier({**MIX, "isolation": "inline"})
    assert [s.metrics for s in score_batch(inline, texts, [COUNTDOWN] * 2)] == [s.metrics for s in got]


def test_a_non_finite_metric_is_an_error_not_a_row_value():
    class Bad:
        bounded = True

        def score(self, completion, answer):
            return Score(1.0, True, metrics={"x": math.nan})

    (s,) = score_batch(Bad(), ["a"], ["a"])
    assert s.error and s.reward == 0.0
