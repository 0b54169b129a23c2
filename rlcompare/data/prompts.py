"""Prompt sets: each yields fixed train and held-out eval lists of `Example`s, deterministic per data seed.

The embedded `arithmetic` set (the default) and `chain` set (the lab task, rlcompare/data/chain_task.py) need no
download; file and hub loaders live in `rlcompare.data.datasets`.
"""

from __future__ import annotations

import random
import sys
from typing import Any

from rlcompare.data.types import Example, PromptSplits  # noqa: F401 - defined there (datasets.py needs them too)


def arithmetic_pairs(max_operand: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]


def arithmetic_splits(
    *, data_seed: int, n_train: int, n_eval: int, max_operand: int, template: str = "{question}"
) -> PromptSplits:
    """`a+b=` prompts. Eval pairs are held out: no eval pair appears in train (or in the warm start).

    Train examples are the remaining pairs, repeated in a seeded order up to `n_train`.
    """
    pairs = arithmetic_pairs(max_operand)
    rng = random.Random(data_seed)
    rng.shuffle(pairs)
    if n_eval >= len(pairs):
        raise ValueError(
            f"prompts.n_eval={n_eval} leaves no training pairs: a+b with operands 0..{max_operand} has only {len(pairs)} pairs; lower prompts.n_eval or raise prompts.max_operand"
        )
    eval_pairs, train_pairs = pairs[:n_eval], pairs[n_eval:]
    make = lambda a, b: Example(template.format(question=f"{a}+{b}="), str(a + b), {"a": a, "b": b})
    train = [make(*train_pairs[i % len(train_pairs)]) for i in range(max(n_train, len(train_pairs)))]
    return PromptSplits(train=train, eval=[make(a, b) for a, b in eval_pairs])


def build_prompts(cfg: Any) -> PromptSplits:
    """Build the train/eval splits named by the `prompts` config group."""
    kind = cfg.kind
    if kind == "arithmetic":
        return arithmetic_splits(
            data_seed=cfg.data_seed,
            n_train=cfg.n_train,
            n_eval=cfg.n_eval,
            max_operand=cfg.max_operand,
            template=cfg.template,
        )
    if kind == "chain":  # the lab task (docs/claims.md)
        from rlcompare.data.chain_task import chain_examples

        train, eval_ = chain_examples(cfg, Example)
        return PromptSplits(train=train, eval=eval_)
    if kind == "reasoning_gym":  # rlcompare/data/gym_tasks.py
        from rlcompare.data.datasets import resolve_template
        from rlcompare.data.gym_tasks import gym_splits

        return gym_splits(cfg, resolve_template(cfg.template), log=lambda m: print(m, file=sys.stderr))
    from rlcompare.data import datasets  # file / hub / countdown loaders

    return datasets.build(cfg)


class PromptStream:
    """Seeded, resumable order over the train examples: epoch-wise reshuffles from `data_seed`."""

    def __init__(self, examples: list[Example], data_seed: int, position: int = 0):
        if not examples:
            raise ValueError("the train split is empty; check prompts.path / prompts.train_split")
        self.examples = examples
        self.data_seed = data_seed
        self.position = position  # examples drawn so far (the data position saved in checkpoints)

    def _order(self, epoch: int) -> list[int]:
        idx = list(range(len(self.examples)))
        random.Random(f"{self.data_seed}/{epoch}").shuffle(idx)
        return idx

    def take(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.examples))
            if i == 0 or not hasattr(self, "_cached") or self._cached[0] != epoch:
                self._cached = (epoch, self._order(epoch))
            out.append(self.examples[self._cached[1][i]])
            self.position += 1
        return out
