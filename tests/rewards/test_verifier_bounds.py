"""Bounded scoring: a bound per batch as well as per completion, errors counted by reason, more than one worker
where the machine has cores, and score_batch never raising on any time bound it is handed.

No assertion here is on speed: each asserts an outcome (which items scored, with which reason), and the only
clock checks are generous bounds that the former behaviour (no batch bound) misses by a wide margin.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcompare.rewards import verifiers as V
from rlcompare.rewards.verifiers import Score, build_verifier, error_counts, score_batch

ROOT = Path(__file__).resolve().parents[2]
REDOS = r"^(a+)+b$"  # catastrophic backtracking on "aaa...c": each such completion runs until its timeout
SLOW = "a" * 40 + "c"


@pytest.fixture
def redos():
    v = build_verifier({"name": "format", "pattern": REDOS, "workers": 1})
    assert score_batch(v, ["aab"], [""], timeout_s=30.0) == [Score(1.0, True)]  # worker started, untimed
    yield v
    v.close()


def test_a_batch_of_slow_completions_stops_at_the_batch_bound(redos):
    # 16 slow completions x 2 s each on one worker took 32 s without a batch bound (the audit's measurement).
    comps = ["aab", "aab"] + [SLOW] * 16
    t0 = time.monotonic()
    out = score_batch(redos, comps, [""] * len(comps), timeout_s=2.0, batch_timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert out[:2] == [Score(1.0, True), Score(1.0, True)]  # scored before the bound: kept
    assert all(s.error and s.reward == 0.0 and not s.correct for s in out[2:])
    # the item running at the bound is killed, the rest never start: all 16 counted as batch timeouts
    assert error_counts(out) == {"batch_timeout": 16}
    assert elapsed < 12.0  # generous: 1 s bound + a kill; without the bound it is 16 x 2 s = 32 s
    # the killed worker is replaced: the next batch scores normally
    assert score_batch(redos, ["aab", "ac"], ["", ""], timeout_s=5.0, batch_timeout_s=30.0) == [
        Score(1.0, True),
        Score(0.0, False),
    ]


def test_the_per_completion_bound_still_applies_inside_the_batch_bound(redos):
    out = score_batch(redos, [SLOW, "aab"], ["", ""], timeout_s=0.3, batch_timeout_s=60.0)
    assert out[0] == Score(0.0, False, True) and out[0].reason == "timeout"
    assert out[1] == Score(1.0, True)
    assert error_counts(out) == {"timeout": 1}


def test_the_batch_bound_comes_from_the_verifier_config(redos):
    redos.batch_timeout_s = 0.5  # as built from verifier.batch_timeout_s; the trainer passes only timeout_s
    out = score_batch(redos, [SLOW] * 6, [""] * 6, timeout_s=5.0)
    assert error_counts(out) == {"batch_timeout": 6}


class _Sleepy:
    """A verifier scored inline (bounded) whose every call takes 0.3 s."""

    bounded = True
    batch_timeout_s = 0.5

    def score(self, completion, answer):
        time.sleep(0.3)
        return Score(1.0, True)


def test_inline_scoring_stops_starting_items_at_the_batch_bound():
    out = score_batch(_Sleepy(), ["x"] * 10, [""] * 10)
    assert out[0] == Score(1.0, True)  # the first item always runs
    done = sum(s.correct for s in out)
    assert 1 <= done <= 3 and error_counts(out) == {"batch_timeout": 10 - done}
    assert all(s.correct for s in out[:done]) and not any(s.correct for s in out[done:])


@pytest.mark.parametrize("bound", [float("inf"), float("nan"), -1.0, 0.0, 1e-9, "2", None])
def test_score_batch_never_raises_on_any_time_bound(bound):
    em = build_verifier({"name": "exact_match"})
    assert score_batch(em, ["17", "18"], ["17", "17"], timeout_s=bound, batch_timeout_s=bound) in (
        [Score(1.0, True), Score(0.0, False)],
        [Score(1.0, True), Score(0.0, False, True)],
    )


@pytest.mark.parametrize("bound", [float("inf"), float("nan"), -1.0])
def test_score_batch_never_raises_on_any_time_bound_with_workers(redos, bound):
    out = score_batch(redos, ["aab"], [""], timeout_s=bound, batch_timeout_s=bound)
    assert len(out) == 1 and isinstance(out[0], Score)
    if bound == float("inf"):  # a day per item and per batch: scored
        assert out == [Score(1.0, True)]
    assert score_batch(redos, ["aab"], [""], timeout_s=5.0) == [Score(1.0, True)]  # and the pool still works


def test_the_10ms_floor_lets_a_quick_item_finish(redos):
    # timeout_s below the floor counts as 10 ms; matching "aab" takes microseconds
    assert score_batch(redos, ["aab"] * 3, [""] * 3, timeout_s=1e-6) == [Score(1.0, True)] * 3
    assert V.MIN_TIMEOUT_S == 0.01


def test_a_failure_inside_scoring_is_a_batch_of_errors_not_a_crash(monkeypatch):
    v = build_verifier({"name": "format", "pattern": REDOS, "workers": 1})

    def broken(*a, **k):
        raise RuntimeError("pool exploded")

    monkeypatch.setattr(V._WorkerPool, "score", broken)
    try:
        with pytest.warns(UserWarning, match="pool exploded"):
            out = score_batch(v, ["aab", "ac"], ["", ""], timeout_s=1.0)
        assert out == [Score(0.0, False, True)] * 2 and error_counts(out) == {"raised": 2}
        assert getattr(v, "_pool", None) is None  # dropped: the next call builds a fresh one
    finally:
        v.close()


def test_error_reasons_are_counted_but_not_compared():
    scores = [V.TIMEOUT, V.BATCH_TIMEOUT, V.BATCH_TIMEOUT, V.ERROR, Score(1.0, True), Score(0.0, False)]
    assert error_counts(scores) == {"timeout": 1, "batch_timeout": 2, "raised": 1}
    assert V.TIMEOUT == V.BATCH_TIMEOUT == Score(0.0, False, True)  # older callers compare without a reason
    assert set(V.ERROR_REASONS) >= {s.reason for s in (V.ERROR, V.TIMEOUT, V.BATCH_TIMEOUT, V.WORKER_LOST, V.NO_WORKER)}


# ---------------------------------------------------------------- workers
@pytest.mark.parametrize("cores, expected", [(1, 1), (2, 2), (3, 3), (16, 4)])
def test_default_workers_use_the_cores(monkeypatch, cores, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert V._default_workers() == expected  # min(4, cores): the trainer waits while a batch is scored


def test_a_default_pool_has_more_than_one_worker_where_there_are_cores():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    v = build_verifier({"name": "format", "pattern": REDOS})
    try:
        assert score_batch(v, ["aab"] * 4, [""] * 4, timeout_s=30.0) == [Score(1.0, True)] * 4
        assert len(v._pool.workers) == min(4, cores)
        if cores >= 2:
            assert len(v._pool.workers) >= 2
    finally:
        v.close()


def test_two_workers_score_slow_items_side_by_side():
    # Two slow items, 2 s each, within a 3.5 s batch bound: with two workers both reach their own timeout;
    # one worker would score the second as a batch timeout.
    v = build_verifier({"name": "format", "pattern": REDOS, "workers": 2})
    try:
        assert score_batch(v, ["aab"] * 2, [""] * 2, timeout_s=30.0) == [Score(1.0, True)] * 2
        out = score_batch(v, [SLOW, SLOW], ["", ""], timeout_s=2.0, batch_timeout_s=3.5)
        assert error_counts(out) == {"timeout": 2}
    finally:
        v.close()


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "key, value",
    [
        ("batch_timeout_s", float("inf")),
        ("batch_timeout_s", float("nan")),
        ("batch_timeout_s", 0),
        ("batch_timeout_s", -5.0),
        ("batch_timeout_s", "30"),
        ("workers", 0),
        ("workers", -2),
        ("workers", 1.5),
        ("workers", True),
    ],
)
def test_bad_bound_or_worker_settings_name_the_key(key, value):
    with pytest.raises(ValueError, match=rf"verifier\.{key}=.*is not accepted"):
        build_verifier({"name": "math_verify", key: value})


def test_cli_refuses_an_infinite_batch_bound_before_the_model_loads(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlcompare.cli",
            "train",
            "verifier.batch_timeout_s=inf",
            "trainer.threads=1",
            "logger=none",
            f"results_dir={tmp_path}/results",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "config error: verifier.batch_timeout_s=inf" in out.stderr
    assert "warm start" not in out.stderr
