"""`prompts.*`: where the prompts come from (a set generated in code, a file, a hub dataset, reasoning-gym) and how
they are split and written, with the accepted values, ranges and checks; generated sets are bounded because they are
built in memory before training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig

from rlcompare.config.checks import AT_LEAST_ONE, FRACTION, SEED, ConfigError, Range, at_least, one_of

PROMPT_KINDS = ("arithmetic", "chain", "countdown", "file", "hf", "reasoning_gym")


@dataclass
class PromptsConfig:
    name: str = "arithmetic"  # the prompt set's name (a label)
    kind: str = "arithmetic"  # where prompts come from: arithmetic | chain | countdown | file | hf | reasoning_gym
    data_seed: int = 0  # seed of the data order and the train/eval split, 0..SEED_MAX (2^31 - 1)
    n_train: int = 2000  # training prompts used (generated sets: built; files: at most); null: all
    n_eval: int = 200  # held-out prompts evaluated
    max_operand: int = 19  # arithmetic: operands drawn from 0..max_operand
    path: Optional[str] = None  # file: the prompt file (.jsonl, .json, .csv or .parquet)
    eval_path: Optional[str] = None  # file: a separate eval file; null: hold out eval_fraction of path
    hf_id: Optional[str] = None  # hf: the dataset id on the Hugging Face hub
    hf_config: Optional[str] = None  # hf: the dataset's config name
    train_split: str = "train"  # hf: the split trained on
    eval_split: Optional[str] = "test"  # hf: the split evaluated; null: hold out eval_fraction of train_split
    eval_fraction: float = 0.1  # share held out for eval when there is no separate eval file/split
    fields: Any = field(
        default_factory=lambda: {"question": "question", "answer": "answer"}
    )  # the dataset's column names for question and answer
    answer_extractor: Optional[str] = (
        None  # how the reference answer is read from the answer column: gsm8k | boxed | none
    )
    template: str = "{question}"  # a literal with {question}, or a named template: plain | boxed | r1 | r1_chat
    chat: bool = False  # wrap prompts in the tokenizer's chat template
    system_prompt: Optional[str] = None  # chat: a system message; null: none
    min_numbers: int = 3  # countdown generator: fewest numbers per puzzle
    max_numbers: int = 4  # countdown generator: most numbers per puzzle
    max_number: int = 99  # countdown generator: numbers drawn from 1..max_number
    max_target: int = 100  # countdown generator: targets in 1..max_target
    min_terms: int = 2  # chain (the lab task): fewest single-digit terms per sum
    max_terms: int = 6  # chain: most terms per sum
    max_term: int = 9  # chain: terms drawn from 1..max_term
    task: Optional[str] = None  # reasoning_gym: the dataset's name (any reasoning-gym lists)
    task_config: Any = field(default_factory=dict)  # reasoning_gym: the dataset's settings (its config fields)
    train_seed: int = 1  # reasoning_gym: the seed the train split is generated from
    eval_seed: int = 1000000  # reasoning_gym: the held-out split's seed (entry i uses seed + i: keep the ranges apart)
    warm_start: Any = None  # a prompt set's own warm-start recipe for model=tiny: keys replace model.warm_start's
    extra: Any = field(default_factory=dict)  # prompt-set specific settings


RANGES: dict[str, Range] = {  # keys narrower than NON_NEGATIVE (schema.py's RANGES holds every section's)
    "prompts.data_seed": SEED,
    "prompts.n_eval": AT_LEAST_ONE,
    "prompts.eval_fraction": FRACTION,
    "prompts.min_numbers": Range(2),
    "prompts.max_numbers": Range(2),
    "prompts.max_number": AT_LEAST_ONE,
    "prompts.max_target": AT_LEAST_ONE,
}


def check(p: DictConfig) -> None:
    """Where the prompts come from, and a generated set's size."""
    one_of("prompts.kind", p.kind, PROMPT_KINDS)
    at_least("prompts.n_eval", p.n_eval, 1)
    if p.n_train is not None:
        at_least("prompts.n_train", p.n_train, 0)
    if p.kind == "file" and not p.path:
        raise ConfigError("prompts.kind=file needs prompts.path (a .jsonl, .json, .csv or .parquet file)")
    if p.kind == "hf" and not p.hf_id:
        raise ConfigError("prompts.kind=hf needs prompts.hf_id (a dataset id on the Hugging Face hub)")
    if p.kind == "arithmetic":
        _check_arithmetic_template(p.template)
    _check_generated_size(p)


def _check_arithmetic_template(template: str) -> None:
    """The embedded arithmetic set formats its template with str.format: it must hold {question} and no other field."""
    try:
        ok = "{question}" in template and template.format(question="") is not None
    except (KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            f"prompts.template={template!r} does not work with prompts.kind=arithmetic: it needs a string "
            f"holding {{question}} and no other {{...}} field (doubled braces {{{{ }}}} stay literal); "
            f"e.g. prompts.template='{{question}}'"
        )


# Examples a generated prompt set may hold, each side: a few seconds to build on 2 cores (10^8 arithmetic examples
# filled the memory; 10^6 Countdown puzzles took over a minute, built again by the job).
MAX_GENERATED = {"arithmetic": 1_000_000, "chain": 1_000_000, "countdown": 100_000, "reasoning_gym": 100_000}
MAX_OPERAND = 999  # arithmetic: (max_operand + 1)^2 pairs are built, a million at 999


def _check_generated_size(p) -> None:
    """Generated sets (arithmetic, countdown without a file) are built in memory before training: bounded sizes."""
    generated = p.kind in ("arithmetic", "chain", "reasoning_gym") or (p.kind == "countdown" and not p.path)
    if not generated:
        return
    for key in ("n_train", "n_eval"):
        if (p[key] or 0) > MAX_GENERATED[p.kind]:
            raise ConfigError(
                f"prompts.{key}={p[key]} must be <= {MAX_GENERATED[p.kind]} for a generated prompt set "
                f"(prompts.kind={p.kind}); the set is built in memory before training"
            )
    if p.kind == "arithmetic" and p.max_operand > MAX_OPERAND:
        raise ConfigError(
            f"prompts.max_operand={p.max_operand} must be <= {MAX_OPERAND}: every pair a+b is built in "
            f"memory ({MAX_OPERAND + 1}^2 = {(MAX_OPERAND + 1) ** 2} pairs at most)"
        )
