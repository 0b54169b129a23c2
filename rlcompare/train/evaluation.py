"""Sampled held-out evaluation (issue 50): `eval.samples` = n completions per held-out prompt, scored by the verifier,
reduced to eval/pass@k, pass^k, maj@k and avg@n (the estimators of `rlcompare.passk`, docs/metrics.md).

The eval draws from streams of its own: one generator per held-out prompt, seeded from (EVAL_STREAM_TAG, eval.seed,
prompt index), never the training generator or its group streams. A prompt's n samples are then a function of the
eval seed, the prompt's index, n and the policy's weights alone (up to the floating-point rounding of a batch of
another shape): every arm evaluates a given policy (the warm start at step 0) on the same samples, and sampling the
eval leaves the training stream where it was. Over several ranks each samples its share of every chunk's prompts
and the per-prompt results are gathered (JSON, never pickled), as the greedy eval's counts are.

Runs with an environment (#51) evaluate episodes the same way: n episodes per held-out prompt, each a success when
its end is correct (`_sample_scored`), reduced by the same estimators.

Eval tokens are counted in eval/tokens only: they never enter the training token budget (`TrainerState.tokens`).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch

from rlcompare import passk
from rlcompare.config import eval_ks
from rlcompare.rewards.answers import distinct, marked_spans, stated_value
from rlcompare.rewards.verifiers import ExactMatch
from rlcompare.rollout import left_pad
from rlcompare.rollout.streams import GroupStreams
from rlcompare.train.context import RolloutContext

# the first element of every eval stream's key: training keys are (seed, rollout, round, group), 4 integers, so
# the two never hash alike (streams.group_seed digests the whole key, its length included)
EVAL_STREAM_TAG = 0x6576616C  # "eval"
_MARKERS = ("answer", "boxed", "hashes")


@dataclass
class PromptResult:
    """One held-out prompt's sampled eval, the unit the ranks gather (JSON data)."""

    index: int  # its position among the held-out prompts
    n: int  # completions sampled
    c: int  # of them scored correct
    maj: list  # [bool] per reported k: whether the majority answer of the first k samples is correct
    tokens: int  # generated tokens of its n completions
    len_correct: int  # tokens of its correct completions
    len_incorrect: int  # tokens of its incorrect completions


def eval_streams(eval_seed: int, prompt_indices: list[int], n: int, device) -> GroupStreams:
    """One stream per held-out prompt (its n completions a group), keyed by (tag, eval seed, prompt index)."""
    return GroupStreams([(EVAL_STREAM_TAG, eval_seed, i) for i in prompt_indices], n, device)


def canonical_answer(verifier, completion: str, max_chars: int = 10_000) -> Optional[str]:
    """The completion's final answer as maj@k compares it: the verifier's final-answer span (exact_match's
    `spans`, else the first of the <answer>/\\boxed{}/#### markers present), as the number it states when it
    states one ("x = 17" and "17.0" are "17"), else its whitespace-collapsed text. None (no vote) when there is no
    span, or several different ones."""
    if isinstance(verifier, ExactMatch):
        _, spans = verifier.spans(completion)
    else:
        _, spans = marked_spans(completion[-max_chars:], _MARKERS)
    spans = distinct(spans)
    if len(spans) != 1:
        return None
    value = stated_value(spans[0])
    if value is not None:
        return str(value)
    text = " ".join(spans[0].split())
    return text or None


def prompt_results(indices, texts, correct, lengths, n: int, ks: list[int], verifier) -> list[PromptResult]:
    """The n completions of each prompt `indices[i]` (rows i*n .. i*n+n-1 of `texts`, `correct`, `lengths`)."""
    out = []
    for i, index in enumerate(indices):
        rows = range(i * n, (i + 1) * n)
        ok = [bool(correct[r]) for r in rows]
        lens = [int(lengths[r]) for r in rows]
        answers = [canonical_answer(verifier, texts[r]) for r in rows]
        out.append(
            PromptResult(
                index=int(index),
                n=n,
                c=sum(ok),
                maj=[passk.majority_correct(answers, ok, k) for k in ks],
                tokens=sum(lens),
                len_correct=sum(x for x, y in zip(lens, ok) if y),
                len_incorrect=sum(x for x, y in zip(lens, ok) if not y),
            )
        )
    return out


def metric_sums(table: torch.Tensor | None) -> list[tuple[float, int]]:
    """Per column of a (B, M) table of the verifier's declared metrics (nan: not reported; None: none declared),
    the sum (float64) and the count of what was reported."""
    if table is None:
        return []
    seen = ~torch.isnan(table)
    return list(zip(torch.where(seen, table, 0.0).sum(0, dtype=torch.float64).tolist(), seen.sum(0).tolist()))


def add_sums(a: list, b: list) -> list:
    """Two `metric_sums` added column by column (an empty one: nothing scored yet, or on that rank)."""
    if not a or not b:
        return list(a or b)
    return [(x + y, m + k) for (x, m), (y, k) in zip(a, b)]


def verifier_entries(verifier, sums: list) -> dict:
    """eval/verifier/<name>: each metric the verifier declares, its mean over the held-out completions that
    reported it (None when none did); nothing when it declares none, or scored no completion (`verifier` None:
    episodes, scored by their environment) (docs/metrics.md)."""
    names = getattr(verifier, "declared_metrics", ())
    sums = sums or [(0.0, 0)] * len(names)
    return {f"eval/verifier/{n}": (s / c if c else None) for n, (s, c) in zip(names, sums)}


def summarize(results: list[PromptResult], ks: list[int]) -> dict:
    """The eval row's sampled metrics from every prompt's result (pure; docs/metrics.md)."""
    ns, cs = [r.n for r in results], [r.c for r in results]
    correct, total = sum(cs), sum(ns)
    row = {}
    for k in ks:
        row[f"eval/pass@{k}"] = passk.mean_pass_at_k(ns, cs, k)
    for k in ks:
        row[f"eval/pass^{k}"] = passk.mean_pass_hat_k(ns, cs, k)
    for j, k in enumerate(ks):
        row[f"eval/maj@{k}"] = sum(r.maj[j] for r in results) / len(results)
    tokens = sum(r.tokens for r in results)
    row.update(
        {
            "eval/avg@n": passk.avg_at_n(ns, cs),
            "eval/mean_length": tokens / total,
            "eval/mean_length_correct": sum(r.len_correct for r in results) / correct if correct else float("nan"),
            "eval/mean_length_incorrect": (
                sum(r.len_incorrect for r in results) / (total - correct) if total > correct else float("nan")
            ),
            "eval/samples": results[0].n,
            "eval/tokens": tokens,
        }
    )
    return row


def evaluate(ctx: RolloutContext, prompts: list, step: int) -> tuple[dict, list[dict], dict | None]:
    """The held-out eval of the policy in `ctx` on `prompts` at training step `step`: (row metrics, sample rows,
    per-prompt counts). Greedy when eval.samples=0 (`evaluate_greedy`; counts None), else eval.samples completions
    per prompt from the eval's own streams (`evaluate_sampled`), with the greedy accuracy too when eval.greedy."""
    e = ctx.cfg.eval
    if not e.samples:
        return (*evaluate_greedy(ctx, prompts, step), None)
    row, samples, counts = evaluate_sampled(ctx, prompts, step)
    if e.greedy:
        greedy, samples = evaluate_greedy(ctx, prompts, step)
        row["eval/accuracy"] = greedy["eval/accuracy"]
        row["eval/tokens"] += round(greedy["eval/mean_length"] * greedy["eval/n"])
    return row, samples, counts


def evaluate_greedy(ctx: RolloutContext, prompts: list, step: int) -> tuple[dict, list[dict]]:
    """Greedy held-out accuracy, over the chunks of `trainer.eval_batch_size` prompts. Over several ranks each
    rank decodes its share of every chunk's rows, padded to the chunk's width as one process pads the whole
    chunk, and the counts are summed: the default's 200 prompts are one chunk, which one rank alone would
    decode while the others wait."""
    t, world = ctx.cfg.trainer, ctx.world
    correct, lengths, samples, sums = 0, 0.0, [], []
    for i in range(0, len(prompts), t.eval_batch_size):
        chunk = prompts[i : i + t.eval_batch_size]
        mine = world.share(len(chunk))
        part = chunk[mine]
        if not part:  # fewer prompts in the chunk than ranks
            continue
        width = max(len(p.ids) for p in chunk)
        _, _, completions = ctx.sample(part, repeat=1, greedy=True, width=width)
        scored = ctx.score(part, completions, 1)
        correct += int(scored.correct.sum())
        lengths += float(completions.lengths.sum())
        sums = add_sums(sums, metric_sums(scored.metrics))
        indices = range(i + mine.start, i + mine.start + len(part))
        samples += _logged_samples(t, step, part, indices, (scored.texts, scored.rewards, scored.correct), 1)
    if world.size > 1:
        parts = world.gather_objects((correct, lengths, samples, sums))
        correct, lengths = sum(p[0] for p in parts), sum(p[1] for p in parts)
        samples = sorted((s for p in parts for s in p[2]), key=lambda s: s[0])
        sums = functools.reduce(add_sums, (p[3] for p in parts), [])
    n = len(prompts)
    samples = [s for _, s in samples[: t.n_samples_logged]]
    row = {"eval/accuracy": correct / n, "eval/mean_length": lengths / n, "eval/n": n}
    return {**row, **verifier_entries(ctx.verifier if ctx.env is None else None, sums)}, samples


def evaluate_sampled(ctx: RolloutContext, prompts: list, step: int) -> tuple[dict, list[dict], dict]:
    """The sampled eval (eval.samples > 0) of the policy in `ctx` on the held-out `prompts`: (row metrics, sample
    rows for samples.jsonl, the per-prompt counts for eval_counts.jsonl: {"n": [n_i], "c": [c_i], "k": [reported
    k], "maj": [[0/1 per prompt] per reported k]}, so that the report recomputes pass@K, pass^K for any K <= n and
    maj@K for a reported K). Every rank returns the whole eval's."""
    e, n, t, world = ctx.cfg.eval, ctx.cfg.eval.samples, ctx.cfg.trainer, ctx.world
    ks = eval_ks(e)
    per_chunk = max(1, t.eval_batch_size // n)  # eval_batch_size completions per forward
    mine, samples, sums = [], [], []
    for start in range(0, len(prompts), per_chunk):
        chunk = prompts[start : start + per_chunk]
        share = world.share(len(chunk))
        part = chunk[share]
        if not part:  # fewer prompts in the chunk than ranks
            continue
        indices = list(range(start + share.start, start + share.stop))
        scored = _sample_scored(ctx, part, indices, max(len(p.ids) for p in chunk))
        texts, rewards, correct, lengths, finals, table = scored
        mine += [asdict(r) for r in prompt_results(indices, finals, correct, lengths, n, ks, ctx.verifier)]
        samples += _logged_samples(t, step, part, indices, (texts, rewards, correct), n)
        sums = add_sums(sums, metric_sums(table))
    if world.size > 1:
        parts = world.gather_objects((mine, samples, sums))
        mine = [r for p in parts for r in p[0]]
        samples = [tuple(s) for p in parts for s in p[1]]
        sums = functools.reduce(add_sums, (p[2] for p in parts), [])
    results = sorted((PromptResult(**r) for r in mine), key=lambda r: r.index)
    samples = [s for _, s in sorted(samples, key=lambda s: s[0])[: t.n_samples_logged]]
    counts = {
        "n": [r.n for r in results],
        "c": [r.c for r in results],
        "k": ks,
        "maj": [[int(r.maj[j]) for r in results] for j in range(len(ks))],  # maj@k needs the answers: kept per k
    }
    row = {**summarize(results, ks), "eval/n": len(results)}
    return {**row, **verifier_entries(ctx.verifier if ctx.env is None else None, sums)}, samples, counts


def _sample_scored(ctx: RolloutContext, part, indices: list[int], width: int):
    """n completions of each prompt of `part` from the eval's own streams, decoded and scored: (texts, rewards,
    correct, lengths, the final answers' texts that maj@k reads, the verifier's declared metrics (B, M) or None). With an environment (`env.name`, #51) n
    episodes of each prompt (`EnvRollout.sample_eval`): correct is the episode's verdict on its end (the
    environment's `info["correct"]` at its last step), lengths count the policy's tokens, texts are the episodes
    marked as samples.jsonl logs them, and the final answer is the episode's last policy turn."""
    e = ctx.cfg.eval
    streams = eval_streams(e.seed, indices, e.samples, ctx.device)
    if ctx.env is not None:
        episodes = ctx.env.sample_eval(ctx, part, streams=streams, width=width)
        o = episodes.outcome
        return o.texts, o.rewards.tolist(), o.correct.tolist(), episodes.lengths.tolist(), o.finals, None
    prompt_ids, prompt_mask = left_pad([p.ids for p in part], ctx.pad_id, ctx.device, width)
    request = replace(
        ctx.request,
        max_new_tokens=e.max_new_tokens or ctx.request.max_new_tokens,
        temperature=e.temperature,
        top_p=e.top_p,
        greedy=False,
        repeats=e.samples,
        logprobs=False,
    )
    ctx.policy.model.eval()
    # rollout.sample, or the run's vLLM engine
    completions = ctx.sampler(ctx.policy.model, prompt_ids, prompt_mask, request, streams=streams)
    s = ctx.score(part, completions, e.samples)
    return s.texts, s.rewards.tolist(), s.correct.tolist(), completions.lengths.tolist(), s.texts, s.metrics


def _logged_samples(t, step: int, part, indices, scored, n: int) -> list:
    """(prompt index, samples.jsonl row) of the first sample of each prompt among the first trainer.n_samples_logged
    (`t`: the trainer settings); `scored`: (texts, rewards, correct) of every completion, n per prompt."""
    texts, rewards, correct = scored
    out = []
    for j, index in enumerate(indices):
        if index >= t.n_samples_logged:
            break
        ex = part[j].example
        row = {
            "step": step,
            "prompt": ex.prompt[: t.sample_max_chars],
            "completion": texts[j * n][: t.sample_max_chars],
            "answer": ex.answer[: t.sample_max_chars],
            "reward": float(rewards[j * n]),
            "correct": bool(correct[j * n]),
        }
        out.append((index, row))
    return out
