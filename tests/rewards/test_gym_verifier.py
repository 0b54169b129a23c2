"""`verifier=reasoning_gym` on prompts of `prompts=reasoning_gym`: a reference answer written as a completion scores 1,
a wrong one 0, every hostile completion of tests/rewards 0 with nothing executed (the audit guard), within the
worker's per-item and per-batch bounds."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlcompare.data.prompts import build_prompts
from rlcompare.rewards.gym_verifier import decode_reference, guarded_score, make_dataset, plain_math
from rlcompare.rewards.verifiers import Score, build_verifier, score_batch
from tests.rewards.test_verifiers import HOSTILE as HOSTILE_1
from tests.rewards.test_verifiers_hostile import HOSTILE as HOSTILE_2

pytestmark = pytest.mark.slow  # its shared setup is seconds on 2 idle cores: out of the quick subset (issue 63)

TASKS = ["countdown", "basic_arithmetic", "chain_sum", "gsm_symbolic", "puzzle24", "spiral_matrix"]
WRONG = {  # a wrong answer in the task's own form
    "countdown": None,  # the first number alone: uses one number only
    "basic_arithmetic": "+1",
    "chain_sum": "+1",
    "gsm_symbolic": "+1",
    "puzzle24": None,
    "spiral_matrix": None,
}
TIMEOUT_S = 2.0


def _prompts(task: str, n_eval: int = 4, template: str = "r1_chat"):
    cfg = {"kind": "reasoning_gym", "task": task, "task_config": {}, "train_seed": 1, "eval_seed": 500}
    cfg.update(n_train=20, n_eval=n_eval, template=template, chat=True, system_prompt=None)
    return build_prompts(OmegaConf.create(cfg))


def _wrong(task: str, answer: str) -> str:
    if WRONG[task] == "+1":
        return str(int(float(answer)) + 1)
    if task in ("countdown", "puzzle24"):
        return answer.replace("*", "+", 1) if "*" in answer else answer.replace("+", "*", 1)
    return "1 2 3"


@pytest.fixture(scope="module")
def verifier():
    v = build_verifier({"name": "reasoning_gym", "workers": 1, "timeout_s": TIMEOUT_S})
    score_batch(v, ["x"], [_prompts("chain_sum").eval[0].answer], timeout_s=60.0)  # start the worker, untimed
    yield v
    v.close()


@pytest.mark.parametrize("task", TASKS)
def test_reference_scores_one_and_a_wrong_answer_zero(verifier, task):
    splits = _prompts(task)
    comps, refs, want = [], [], []
    for ex in splits.eval:
        ans = ex.meta["answer_text"]
        comps += [f"<think> work </think> <answer>{ans}</answer>", f"The result is \\boxed{{{ans}}}", ans]
        comps.append(f"<answer>{_wrong(task, ans)}</answer>")
        comps.append(f"<answer>{ans}</answer> <answer>{_wrong(task, ans)}</answer>")  # a hedge
        refs += [ex.answer] * 5
        want += [1.0, 1.0, 1.0, 0.0, 0.0]
    out = score_batch(verifier, comps, refs, timeout_s=TIMEOUT_S)
    assert [s.reward for s in out] == want, [(c[-60:], s) for c, s in zip(comps, out)]
    assert not any(s.error for s in out)


def test_countdown_near_misses_score_zero_not_the_datasets_consolation(verifier):
    ex = _prompts("countdown").eval[0]
    ref = decode_reference(ex.answer)
    nums = make_dataset(ref["task"], ref["config"], ref["seed"], ref["size"])[ref["index"]]["metadata"]["numbers"]
    # reasoning-gym gives 0.05 to an expression that does not use the numbers, 0.01 to junk: 0 here by default
    comps = [f"<answer>{nums[0]}</answer>", "<answer>not math</answer>", ""]
    assert [s.reward for s in score_batch(verifier, comps, [ex.answer] * 3, timeout_s=TIMEOUT_S)] == [0.0] * 3
    partial = build_verifier({"name": "reasoning_gym", "partial_credit": True, "isolation": "inline"})
    assert partial.score(f"<answer>{nums[0]}</answer>", ex.answer) == Score(0.05, False)


@pytest.mark.parametrize("task", ["countdown", "spiral_matrix", "chain_sum"])
def test_hostile_completions_score_zero_within_the_bound(verifier, task):
    ref = _prompts(task).eval[0].answer
    for case, text in {**HOSTILE_1, **HOSTILE_2}.items():
        score_batch(verifier, ["x"], [ref], timeout_s=30.0)  # a worker killed by the previous case restarts here
        t0 = time.perf_counter()
        (s,) = score_batch(verifier, [text], [ref], timeout_s=TIMEOUT_S)
        assert time.perf_counter() - t0 < TIMEOUT_S + 1.5, case
        assert isinstance(s, Score) and math.isfinite(s.reward) and s.reward == 0.0 and not s.correct, case


def _payload(marker: Path) -> str:
    return f"__import__('pathlib').Path('{marker}').write_text('ran')"


@pytest.mark.parametrize("task", ["countdown", "spiral_matrix", "string_insertion", "polynomial_multiplication"])
def test_code_in_an_answer_is_never_run(task, tmp_path):
    """These scorers pass the answer to eval / sympy's parse_expr: unguarded, the payload runs (checked first)."""
    ex = _prompts(task).eval[0]
    ref = decode_reference(ex.answer)
    dataset = make_dataset(ref["task"], ref["config"], ref["seed"], ref["size"])
    entry = dataset[ref["index"]]
    marker = tmp_path / "ran.txt"
    dataset.score_answer(_payload(marker), entry)  # reasoning-gym alone runs it (in this test only)
    assert marker.exists()
    marker.unlink()
    v = build_verifier({"name": "reasoning_gym", "isolation": "inline"})
    for text in (_payload(marker), f"<answer>{_payload(marker)}</answer>", f"\\boxed{{{_payload(marker)}}}"):
        assert v.score(text, ex.answer) == Score(0.0, False)
        assert not marker.exists()


class _Sneaky:
    """A scorer that tries what the audit guard refuses, whatever the answer."""

    def __init__(self, action):
        self.action = action

    def score_answer(self, answer, entry):
        self.action()
        return 1.0


@pytest.mark.parametrize(
    "what",
    ["system", "write", "spawn", "socket", "remove"],
)
def test_the_audit_guard_refuses_processes_files_and_sockets_while_scoring(what, tmp_path):
    import socket
    import subprocess

    marker = tmp_path / "m"
    keep = tmp_path / "keep"
    keep.write_text("x")
    actions = {
        "system": lambda: os.system(f"touch {marker}"),
        "write": lambda: open(marker, "w").close(),
        "spawn": lambda: subprocess.run(["touch", str(marker)]),
        "socket": lambda: socket.create_connection(("127.0.0.1", 9)),
        "remove": lambda: os.remove(keep),
    }
    value, refused = guarded_score(_Sneaky(actions[what]), "1", {"answer": "1"})
    assert refused and value is None
    assert not marker.exists() and keep.exists()
    open(marker, "w").close()  # outside scoring the guard is idle
    assert marker.exists()


def test_plain_math_allows_math_and_refuses_code():
    for ok in ("94*4 - 61 - 6", "-4", "(3 + 5) / 2", "2240*x**3 + 3584*x**2", "-34*x**8/15 + C", "sqrt(2)*pi", "1.5"):
        assert plain_math(ok), ok
    for bad in (
        "__import__('os')",
        "().__class__",
        "E.func",
        "open(1)",
        "eval(chr(95))",
        "lambda: 1",
        "x; y",
        "'a'",
        "[[1, 2]][0].pop()",
    ):
        assert not plain_math(bad), bad


def test_a_reference_that_regenerates_differently_is_an_error(verifier):
    ex = _prompts("chain_sum").eval[0]
    forged = ex.answer.replace('"answer": "', '"answer": "9', 1)
    (s,) = score_batch(verifier, [f"<answer>{ex.meta['answer_text']}</answer>"], [forged], timeout_s=TIMEOUT_S)
    assert s.error and s.reward == 0.0
    (s,) = score_batch(verifier, ["<answer>1</answer>"], ['{"task": "chain_sum"}'], timeout_s=TIMEOUT_S)
    assert s.error
