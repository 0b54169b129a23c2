"""The lab task (`prompts=chain`): sums of 2-6 digits, answered directly or through written partial sums.

Built so that the mechanisms the papers argue about have room to act on a CPU in minutes (docs/claims.md):

* **Length varies and matters.** A completion may state the sum at once (`17`), list the running sums one per line
  (`11\\n16\\n17`), or write every step (`3+8=11\\n11+5=16\\n16+1=17`). The last line is the answer
  (`verifier.number: last`), so all three are correct when the sum is. The warm start writes all three; a tiny
  model adds two numbers far better than six, so written steps pay off on long prompts, and RL can lengthen or
  shorten what it writes (Dr. GRPO's length bias, arXiv 2503.20783, needs that room).
* **Prompts differ in difficulty.** Two terms are easy (groups all correct), six are hard (groups all wrong), the
  middle is mixed: what std normalization and dynamic sampling act on.
* **Entropy starts high.** The warm start mixes the three forms and makes a slip in a fifth of its targets, so
  the first token (which form) and the digits are uncertain; entropy can collapse (DAPO's clip-higher).
* **A held-out split.** Eval lists are drawn first and never appear in train or in the warm start.

Pure Python (no torch): the generator, the three forms and the warm start's targets.
"""

from __future__ import annotations

import random
import re
from typing import Any

FORMS = ("answer", "sums", "steps", "calc")  # calc: the tool-use environment's (env=calc, prompts=chain_calc)


def partial_sums(terms: list[int]) -> list[int]:
    """Running sums after each addition: [3, 8, 5] -> [11, 16]."""
    out, s = [], terms[0]
    for t in terms[1:]:
        s += t
        out.append(s)
    return out


def chain_prompt(terms: list[int]) -> str:
    return "+".join(map(str, terms)) + "="


def write_form(terms: list[int], form: str, slip: tuple[int, int] | None = None) -> str:
    """A completion of `form` for `terms`; `slip=(step, offset)` adds `offset` to that step's sum (and so to every
    later sum: the slip propagates, as a real one would)."""
    sums, s = [], terms[0]
    for i, t in enumerate(terms[1:]):
        s += t + (slip[1] if slip and slip[0] == i else 0)
        sums.append(s)
    if form == "answer":
        return str(sums[-1])
    if form == "sums":
        return "\n".join(map(str, sums))
    if form == "steps":
        prev = [terms[0], *sums[:-1]]
        return "\n".join(f"{a}+{t}={s}" for a, t, s in zip(prev, terms[1:], sums))
    if form == "calc":  # a call, the tool's answer (always right), then the final answer (where a slip shows)
        return f"<calc>{'+'.join(map(str, terms))}</calc>{sum(terms)}\n{sums[-1]}"
    raise ValueError(f"unknown chain form {form!r}; use one of: {', '.join(FORMS)}")


def sft_target(
    terms: list[int],
    rng: random.Random,
    form_weights: dict[str, float],
    slip_frac: float,
    slip_offsets: tuple[int, ...],
) -> str:
    """The warm start's target for one prompt: a form drawn by weight; with probability `slip_frac` one step is
    off by one of `slip_offsets` (upward, like the default task's noisy labels: a shared bias RL can undo)."""
    forms = [f for f in FORMS if form_weights.get(f, 0) > 0]
    form = rng.choices(forms, weights=[form_weights[f] for f in forms])[0]
    slip = None
    if rng.random() < slip_frac:
        slip = (rng.randrange(len(terms) - 1), rng.choice(tuple(slip_offsets)))
    return write_form(terms, form, slip)


def _terms(rng: random.Random, k: int, max_term: int) -> tuple[int, ...]:
    return tuple(rng.randint(1, max_term) for _ in range(k))


def chain_lists(
    *, data_seed: int, n_train: int, n_eval: int, min_terms: int, max_terms: int, max_term: int
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(train, eval) term lists. Eval is drawn first, an equal share per number of terms, without repeats; train
    lists (repeats allowed: two terms have only max_term^2 lists) never equal an eval list."""
    if not 2 <= min_terms <= max_terms <= 9:
        raise ValueError(
            f"prompts.min_terms={min_terms} / prompts.max_terms={max_terms}: need 2 <= min_terms <= max_terms <= 9"
        )
    if not 1 <= max_term <= 9:
        raise ValueError(f"prompts.max_term={max_term} must be in 1..9 (terms are single digits)")
    rng = random.Random(f"chain/{data_seed}")
    ks = list(range(min_terms, max_terms + 1))
    eval_: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    held_out = dict.fromkeys(ks, 0)  # eval lists drawn so far, per number of terms
    for j in range(n_eval):
        k = ks[j % len(ks)]
        if max_term**k <= 2 * held_out[k]:
            raise ValueError(
                f"prompts.n_eval={n_eval} holds out more than half of the {max_term**k} lists of "
                f"{k} terms; lower prompts.n_eval or raise prompts.min_terms"
            )
        terms = _terms(rng, k, max_term)
        while terms in seen:
            terms = _terms(rng, k, max_term)
        seen.add(terms)
        held_out[k] += 1
        eval_.append(terms)
    train = []
    while len(train) < n_train:
        terms = _terms(rng, rng.randint(min_terms, max_terms), max_term)
        if terms not in seen:
            train.append(terms)
    return train, eval_


def chain_examples(cfg: Any, make_example) -> tuple[list, list]:
    """`make_example(prompt, answer, meta)` -> Example, for both splits of the `prompts` config."""
    train, eval_ = chain_lists(
        data_seed=cfg.data_seed,
        n_train=cfg.n_train,
        n_eval=cfg.n_eval,
        min_terms=cfg.min_terms,
        max_terms=cfg.max_terms,
        max_term=cfg.max_term,
    )
    make = lambda t: make_example(
        cfg.template.replace("{question}", chain_prompt(list(t))), str(sum(t)), {"terms": list(t)}
    )
    return [make(t) for t in train], [make(t) for t in eval_]


_LIST = re.compile(r"(\d(?:\+\d)+)=")


def terms_of(prompt: str) -> list[int]:
    """The terms of a chain prompt (the last `d+d+...=` in it, whatever template surrounds it)."""
    found = _LIST.findall(prompt)
    if not found:
        raise ValueError(f"not a chain prompt (no d+d+...=): {prompt[:80]!r}")
    return [int(t) for t in found[-1].split("+")]
