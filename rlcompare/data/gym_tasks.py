"""`prompts=reasoning_gym`: prompt sets from reasoning-gym's procedural datasets (`pip install -e '.[gym]'`).

`prompts.task` names the dataset (any name reasoning-gym lists: `task_names()`), `prompts.task_config` its settings
(the dataset's own config fields, e.g. `{min_numbers: 3, max_numbers: 4}` for countdown). The train split is the
dataset built with seed `prompts.train_seed` and size `prompts.n_train`, the held-out split the one built with
`prompts.eval_seed` and `prompts.n_eval`. reasoning-gym draws entry i from seed + i, so the seed ranges
[seed, seed + size) of the two splits must not meet (refused otherwise); a train entry whose question is still a
held-out question (a small task space repeats questions) is dropped (the count is logged), so the splits never
overlap, and `check_disjoint` verifies it on the result.

Each prompt is rlcompare's template (`prompts.template`: plain, boxed, r1, r1_chat or a literal) around the entry's
question. The reference (`Example.answer`) is JSON naming the entry (`gym_verifier.encode_reference`: task, config,
seed, size, index, and its answer), which `verifier=reasoning_gym` regenerates and scores with the dataset's own
`score_answer`. `meta["answer_text"]` is the entry's answer as a completion states it (the verifier probe and the
tiny model's warm start read it).
"""

from __future__ import annotations

import json
from typing import Any

from rlcompare.data.types import Example, PromptSplits
from rlcompare.rewards.gym_verifier import encode_reference, make_dataset

MAX_ENTRIES = 100_000  # per split: the set is built in memory before training


def task_names() -> list[str]:
    """Every dataset reasoning-gym lists (its registry), sorted."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _plain(value: Any) -> Any:
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return value


def check_task(task: Any) -> str:
    """`task` when reasoning-gym lists it; else ValueError with the list."""
    try:
        names = task_names()
    except ImportError:
        raise ValueError(
            "prompts=reasoning_gym needs the reasoning-gym package: pip install -e '.[gym]' (or reasoning-gym)"
        ) from None
    if task not in names:
        raise ValueError(f"prompts.task={task!r} is not a reasoning-gym dataset; use one of: {', '.join(names)}")
    return task


def _entries(task: str, config: dict, seed: int, size: int) -> list[dict]:
    try:
        dataset = make_dataset(task, config, seed, size)
        return [dataset[i] for i in range(size)]
    except Exception as e:  # noqa: BLE001 - the dataset's own check of its config
        raise ValueError(
            f"prompts.task_config={json.dumps(config)} is not accepted by reasoning-gym's {task}: "
            f"{type(e).__name__}: {str(e)[:300]}"
        ) from None


def check_disjoint(train: list[Example], eval_: list[Example]) -> None:
    """No held-out question is a train question (ValueError naming one otherwise)."""
    held = {ex.meta["question"] for ex in eval_}
    both = [ex.meta["question"] for ex in train if ex.meta["question"] in held]
    if both:
        raise ValueError(f"prompts=reasoning_gym: the train split holds a held-out question: {both[0][:120]!r}")


def _check_seed_ranges(train_seed: int, n_train: int, eval_seed: int, n_eval: int) -> None:
    """reasoning-gym draws entry i of a dataset from seed + i, so two seeds closer than the sizes share entries
    (seeds 1 and 2 share all but one): the two ranges of seeds must not meet."""
    if train_seed < eval_seed + n_eval and eval_seed < train_seed + n_train:
        raise ValueError(
            f"prompts.train_seed={train_seed} (n_train={n_train}) and prompts.eval_seed={eval_seed} (n_eval={n_eval}): "
            f"reasoning-gym generates entry i from seed + i, so these splits would share entries; set seeds at least "
            f"n_train / n_eval apart (e.g. prompts.eval_seed={train_seed + n_train})"
        )


def check_gym_settings(cfg: Any) -> tuple[str, dict, int, int, int, int]:
    """(task, task_config, train_seed, n_train, eval_seed, n_eval) once every setting of `prompts=reasoning_gym` is
    accepted: the dataset's name, its config (one entry generated), the sizes and the split seeds; else ValueError.
    Cheap, so `rlcompare train` runs it before Hydra makes the run folder."""
    task = check_task(cfg.get("task"))
    config = _plain(cfg.get("task_config")) or {}
    if not isinstance(config, dict) or any(k in config for k in ("seed", "size")):
        raise ValueError(
            "prompts.task_config must be a mapping of the dataset's settings without seed and size "
            "(set prompts.train_seed / prompts.eval_seed and prompts.n_train / prompts.n_eval)"
        )
    train_seed, eval_seed = int(cfg.get("train_seed")), int(cfg.get("eval_seed"))
    if train_seed == eval_seed:
        raise ValueError(f"prompts.train_seed and prompts.eval_seed are both {train_seed}; give them different seeds")
    n_train, n_eval = int(cfg.get("n_train") or 0), int(cfg.get("n_eval") or 0)
    if not (1 <= n_train <= MAX_ENTRIES and 1 <= n_eval <= MAX_ENTRIES):
        raise ValueError(f"prompts.n_train={n_train} and prompts.n_eval={n_eval} must be in 1..{MAX_ENTRIES}")
    _check_seed_ranges(train_seed, n_train, eval_seed, n_eval)
    _entries(task, config, train_seed, 1)  # the dataset's own check of its config
    return task, config, train_seed, n_train, eval_seed, n_eval


def gym_splits(cfg: Any, template: str, log=print) -> PromptSplits:
    """The train and held-out splits of `prompts=reasoning_gym` (see the module doc)."""
    task, config, train_seed, n_train, eval_seed, n_eval = check_gym_settings(cfg)
    make = lambda seed, size, i, e: Example(  # noqa: E731
        template.replace("{question}", str(e["question"])),
        encode_reference(task, config, seed, size, i, e.get("answer")),
        {"question": str(e["question"]), "answer_text": None if e.get("answer") is None else str(e["answer"])},
    )
    eval_ = [make(eval_seed, n_eval, i, e) for i, e in enumerate(_entries(task, config, eval_seed, n_eval))]
    held = {ex.meta["question"] for ex in eval_}
    train_all = [make(train_seed, n_train, i, e) for i, e in enumerate(_entries(task, config, train_seed, n_train))]
    train = [ex for ex in train_all if ex.meta["question"] not in held]
    if len(train) < len(train_all):
        log(f"[rlcompare] prompts=reasoning_gym: dropped {len(train_all) - len(train)} train entries that are held out")
    if not train:
        raise ValueError(f"prompts.task={task}: every train entry is a held-out question; widen prompts.task_config")
    check_disjoint(train, eval_)
    return PromptSplits(train=train, eval=eval_, chat=bool(cfg.get("chat")), system_prompt=cfg.get("system_prompt"))
