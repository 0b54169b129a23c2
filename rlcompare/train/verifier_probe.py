"""Before training: can the run's verifier score its own prompt set?

`verifier=countdown` on the arithmetic prompts errors on every call, and `prompts=countdown verifier=exact_match`
can never give reward 1; both used to train on zero reward for the whole budget. So a few of the prompt set's own
reference answers are written as correct completions, in the form the set's template asks for, and scored with the
run's verifier: they must score correct (without an error), or the run stops naming `prompts=` and `verifier=`
(when at least half fail; fewer give a warning: a few references the verifier cannot read, e.g. math-verify on
some MATH answers, should not block a run, but a whole set it cannot read must).
A surely wrong answer in the same form (an integer reference plus one; a Countdown puzzle's bare target, which uses
a number not given) must score wrong: math_verify on Countdown references read the target alone as correct.

The form follows the template's own text: after an R1 template (`<answer> </answer>` tags) the answer goes in
`<answer>...</answer>` after `</think>`; after the boxed template, in `\\boxed{...}`; otherwise the completion is
the bare answer (the embedded `a+b=` set). A Countdown reference (`{"nums": [...], "target": N}`) is answered with
an expression that reaches the target (the generator's own solution, else a small search).

A verifier whose `correct` ignores the reference (`format`, or `weighted` with `format` first) is not probed. A
probed verifier that reports a metric it does not declare is refused here, before the model loads.
`verifier.probe=false` turns the probe off for completions of another form than these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rlcompare.config import ConfigError

N_PROBES = 8  # reference answers probed: eval examples first, then train
MAX_CANDIDATES = 32  # examples looked at to find N_PROBES that can be written (Countdown puzzles need a solution)
MAX_SOLVE_NUMBERS = 4  # the search for a Countdown solution tries every expression over at most this many numbers
THINK = "I work it out."  # reasoning without digits: no verifier may read a number from it


# ----------------------------------------------------------------------------- the two sides, built (no torch)
def build_prompt_set(cfg: Any):
    """The run's prompt splits; any failure (missing file or field, bad template, hub error) as a ConfigError."""
    from rlcompare.data.prompts import build_prompts

    try:
        return build_prompts(cfg.prompts)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the loaders' messages name their key
        msg = str(e)
        raise ConfigError(msg if "prompts." in msg else f"prompts (prompts.kind={cfg.prompts.kind}): {msg}") from None


def build_run_verifier(cfg: Any):
    """The run's verifier; any failure (unknown name, bad pattern or component) as a ConfigError."""
    from rlcompare.rewards.registry import build_verifier

    try:
        return build_verifier(cfg.verifier)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        raise ConfigError(msg if "verifier" in msg else f"verifier.name={cfg.verifier.name!r}: {msg}") from None


# ----------------------------------------------------------------------------- the completions
def completions_for(template: str, answer_text: str) -> tuple[str, ...]:
    """Completions of a prompt made from `template` that answer `answer_text` in the form it asks for; a template
    that asks for no form gets the bare answer, in $...$ and in \\boxed{} (a model may write any of them)."""
    if "<answer>" in template:  # R1: reasoning in <think> </think>, the answer in <answer> </answer>
        opened = template.rstrip().endswith("<think>")  # the base-model template ends inside <think>
        return (f"{'' if opened else '<think>'} {THINK} </think> <answer>{answer_text}</answer>",)
    if "\\boxed" in template:
        return (f"{THINK} The final answer is \\boxed{{{answer_text}}}.",)
    return answer_text, f"${answer_text}$", f"\\boxed{{{answer_text}}}"


def solve_countdown(nums: list[int], target: int, require_all: bool = False) -> str | None:
    """An expression over `nums` (each at most once; `require_all`: each exactly once) equal to `target`, or None
    (no solution, or more than MAX_SOLVE_NUMBERS numbers)."""
    if len(nums) > MAX_SOLVE_NUMBERS:
        return None
    return _search([(Fraction(n), str(n)) for n in nums], Fraction(target), require_all)


def _search(items: list[tuple[Fraction, str]], target: Fraction, require_all: bool) -> str | None:
    for value, expr in items:
        if value == target and (len(items) == 1 or not require_all):
            return expr
    for i in range(len(items)):
        for j in range(len(items)):
            if i == j:
                continue
            (a, ea), (b, eb) = items[i], items[j]
            rest = [x for k, x in enumerate(items) if k not in (i, j)]
            combined = [(a - b, f"({ea} - {eb})")]
            if i < j:  # + and * commute: one order is enough
                combined += [(a + b, f"({ea} + {eb})"), (a * b, f"({ea} * {eb})")]
            if b != 0:
                combined.append((a / b, f"({ea} / {eb})"))
            for value, expr in combined:
                found = _search(rest + [(value, expr)], target, require_all)
                if found is not None:
                    return found
    return None


def _answer_text(example, countdown: bool, require_all: bool) -> str | None:
    if "answer_text" in (example.meta or {}):  # a structured reference (reasoning_gym): what a completion states
        return example.meta["answer_text"]
    if not countdown:
        return str(example.answer)
    meta = example.meta or {}
    if meta.get("solution"):  # the generator's own expression uses every number once
        return str(meta["solution"])
    nums, target = meta.get("nums"), meta.get("target")
    return None if nums is None or target is None else solve_countdown(list(nums), int(target), require_all)


def _wrong_text(example, countdown: bool) -> str | None:
    """An answer that is wrong for sure: the bare target of a Countdown puzzle (it uses a number not given), an
    integer reference plus one; None for other references (a different-looking text may still be equivalent)."""
    if countdown:
        meta = example.meta or {}
        nums, target = meta.get("nums"), meta.get("target")
        return None if nums is None or target is None or int(target) in nums else str(int(target))
    ref = str((example.meta or {}).get("answer_text") or example.answer).strip()
    return str(int(ref) + 1) if re.fullmatch(r"-?[0-9]{1,18}", ref) else None


@dataclass(frozen=True)
class Probe:
    completions: tuple[str, ...]  # forms of one answer: correct when any form scores correct
    reference: str
    correct: bool  # what the verifier must say


def reads_reference(verifier) -> bool:
    """Whether the verifier's `correct` depends on the reference answer (format's does not)."""
    from rlcompare.rewards.verifiers import FormatCheck, Weighted

    if isinstance(verifier, Weighted):
        return reads_reference(verifier.components[0][0])
    return not isinstance(verifier, FormatCheck)


def probes(prompts_cfg: Any, splits, require_all: bool = False) -> list[Probe]:
    """Up to N_PROBES of the set's examples answered correctly in its template's form, and for each that has one a
    surely wrong answer in the same form (a verifier that scores it correct does not check what the set asks)."""
    from rlcompare.data.datasets import resolve_template

    template = resolve_template(prompts_cfg.template)
    countdown = prompts_cfg.kind == "countdown"
    right, wrong = [], []
    for example in (list(splits.eval) + list(splits.train))[:MAX_CANDIDATES]:
        text = _answer_text(example, countdown, require_all)
        if text is None:
            continue
        right.append(Probe(completions_for(template, text), str(example.answer), True))
        bad = _wrong_text(example, countdown)
        if bad is not None:
            wrong.append(Probe(completions_for(template, bad), str(example.answer), False))
        if len(right) == N_PROBES:
            break
    return right + wrong


@dataclass(frozen=True)
class Verdict:
    probe: Probe
    correct: bool  # any form scored correct
    error: bool  # the verifier raised or timed out on a form
    reward: float  # the best reward over the forms

    @property
    def failed(self) -> bool:  # for a correct answer: scored wrong, or the verifier faulted
        return self.error or not self.correct


def score_probes(verifier, checks: list[Probe], timeout_s: float) -> list[Verdict]:
    """Each probe's verdict; a metric the verifier reports without declaring it is refused here, before training."""
    from rlcompare.rewards.pool import score_batch
    from rlcompare.rewards.registry import metric_table

    flat = [(i, c) for i, p in enumerate(checks) for c in p.completions]
    scores = score_batch(verifier, [c for _, c in flat], [checks[i].reference for i, _ in flat], timeout_s=timeout_s)
    try:
        metric_table(scores, getattr(verifier, "declared_metrics", ()), getattr(verifier, "name", "verifier"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out = []
    for i, p in enumerate(checks):
        mine = [s for (j, _), s in zip(flat, scores) if j == i]
        out.append(Verdict(p, any(s.correct for s in mine), any(s.error for s in mine), max(s.reward for s in mine)))
    return out


def check_verifier_reads_prompts(cfg: Any, splits, verifier) -> str | None:
    """Raise ConfigError naming prompts= and verifier= when the verifier scores a surely wrong answer correct, or at
    least half of the correct answers wrong (or raises on them); a warning (one line) when fewer fail, else None."""
    if not cfg.verifier.probe or not reads_reference(verifier):
        return None
    checks = probes(cfg.prompts, splits, require_all=bool(cfg.verifier.get("require_all", False)))
    if not checks:
        return None
    verdicts = score_probes(verifier, checks, float(cfg.verifier.timeout_s))
    right = [v for v in verdicts if v.probe.correct]
    right_failed = [v for v in right if v.failed]
    wrong_passed = [v for v in verdicts if not v.probe.correct and v.correct]  # a reward for a wrong answer
    if right_failed and 2 * len(right_failed) >= len(right):
        raise ConfigError(_message(cfg, right_failed[0], len(right_failed), len(right)))
    if wrong_passed:
        raise ConfigError(_message(cfg, wrong_passed[0], len(wrong_passed), len(verdicts) - len(right)))
    if right_failed:
        return _message(cfg, right_failed[0], len(right_failed), len(right), refused=False)
    return None


def _message(cfg: Any, v: Verdict, n_failed: int, n: int, refused: bool = True) -> str:
    kind = "correct" if v.probe.correct else "surely wrong"
    how = (
        "the verifier raised or timed out"
        if v.error
        else f"reward {v.reward:g}, {'not ' if v.probe.correct else ''}counted correct"
    )
    head = f"prompts={cfg.prompts.name} verifier={cfg.verifier.name}: "
    what = (
        f"{n_failed} of {n} {kind} answers to the set's own references, written as completions in its "
        f"template's form, were scored {'wrong' if v.probe.correct else 'correct'} (e.g. completion "
        f"{v.probe.completions[0][-120:]!r} for the reference {v.probe.reference[:120]!r}: {how})"
    )
    if not refused:
        return head + "warning: " + what + "; those prompts can never be rewarded"
    suggest = {"countdown": "verifier=countdown or verifier=weighted", "reasoning_gym": "verifier=reasoning_gym"}.get(
        cfg.prompts.kind, "verifier=exact_match or verifier=math_verify"
    )
    return (
        head + "the verifier cannot score this prompt set: " + what + f"; pick a verifier that reads these "
        f"answers (e.g. {suggest}), or set verifier.probe=false if the completions will take another form"
    )
