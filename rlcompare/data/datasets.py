"""File, Hugging Face hub and Countdown prompt sets -> `PromptSplits` (the embedded arithmetic set is in prompts.py).

`build(cfg)` reads the `prompts` config group:

* `kind: file`      local `.jsonl` / `.json` / `.csv` / `.parquet` at `prompts.path` (+ optional `prompts.eval_path`)
* `kind: hf`        `datasets.load_dataset(prompts.hf_id, prompts.hf_config, split=...)` (needs `pip install datasets`)
* `kind: countdown` TinyZero-style generator (or rows with `nums`/`target` from `prompts.path`)

Order and split are deterministic per `data_seed`: rows are shuffled with `random.Random(data_seed)`.
Without a separate eval file/split, `round(eval_fraction * rows)` rows (at least 1; `eval_fraction: 0` -> `n_eval`
rows) are held out, then `n_eval` / `n_train` cap each side (0 or null = all). Capping never moves a row across
the split, so changing `n_eval` leaves the train set unchanged.

No prompt is both trained on and held out: a prompt repeated in a file is kept once (a Countdown puzzle is its
numbers in any order and its target), and a prompt of a separate eval file or split leaves the train set; each
with a warning. A file's rows are read by `files.py` (errors name the file and the line); a question or answer
must be text or a number, Countdown numbers whole numbers (3.7 and `true` are refused, not cast).

`template` is a named template (`plain`, `boxed`, `r1`, `r1_chat`; see `TEMPLATES`) or a literal string holding
`{question}` (only that placeholder is substituted; other braces are kept as they are, e.g. `\\boxed{}`).
"""

from __future__ import annotations

import math
import random
import re
import warnings
from typing import Any

from rlcompare.data.files import FILE_TYPES, Rows, json_value, read_rows  # noqa: F401 - FILE_TYPES: re-exported
from rlcompare.data.types import Example, PromptSplits
from rlcompare.rewards.countdown_expr import MAX_ABS, MAX_LITERAL, encode_countdown
from rlcompare.rewards.answers import after_hashes, last_boxed

TEMPLATES = {
    "plain": "{question}",
    "boxed": "{question}\nPlease reason step by step, and put your final answer within \\boxed{}.",
    # DeepSeek-R1-Zero's template for base models (chat: false); the completion continues after "<think>".
    "r1": (
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
        "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
        "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
        "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n"
        "User: {question}\nAssistant: <think>"
    ),
    # The same instructions for chat models (chat: true; the tokenizer's chat template adds the roles).
    "r1_chat": (
        "{question}\nThink about the reasoning process first, then give the answer. Enclose the reasoning in "
        "<think> </think> tags and the final answer in <answer> </answer> tags, i.e., "
        "<think> reasoning process here </think> <answer> answer here </answer>."
    ),
}
EXTRACTORS = ("gsm8k", "boxed", "none")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    try:
        v = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    except Exception:
        v = getattr(cfg, key, default)
    return default if v is None else v


def _fields(cfg: Any) -> dict:
    f = _get(cfg, "fields", {}) or {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(f, DictConfig):
            f = OmegaConf.to_container(f, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(f)


def resolve_template(template: str | None) -> str:
    """A named template or a literal with `{question}` -> the literal."""
    t = template or "{question}"
    if "{question}" in t:
        return t
    if t in TEMPLATES:
        return TEMPLATES[t]
    raise ValueError(
        f"prompts.template={t!r} is neither a named template ({', '.join(TEMPLATES)}) "
        "nor a string containing {question}"
    )


def apply_template(template: str, question: str) -> str:
    return template.replace("{question}", question)


def extract_answer(text: Any, extractor: str | None) -> str | None:
    """`gsm8k`: text after the last `####`; `boxed`: last `\\boxed{...}` content; `none`: as is. None if absent."""
    s = _to_text(text)
    if extractor in (None, "none"):
        return s.strip()
    if extractor == "gsm8k":
        got = after_hashes(s)
        return None if got is None else got.replace(",", "").strip()
    if extractor == "boxed":
        got = last_boxed(s)
        return None if got is None else got.strip()
    raise ValueError(f"prompts.answer_extractor={extractor!r} is not accepted; use one of: {', '.join(EXTRACTORS)}")


def _to_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if hasattr(v, "item") and not isinstance(v, (list, dict)):  # numpy scalar
        try:
            return _to_text(v.item())
        except Exception:
            pass
    return str(v)


# ----------------------------------------------------------------------------- rows -> examples
def _columns(rows: list[dict]) -> str:
    seen: dict[str, None] = {}
    for r in rows[:100]:
        seen.update(dict.fromkeys(map(str, r)))
    return ", ".join(seen) or "(none)"


def _field(rows: Rows, i: int, name: str, role: str, where: str) -> Any:
    row = rows.rows[i]
    if name not in row:
        raise ValueError(
            f"{where}: field {name!r} (prompts.fields.{role}) not found"
            + (f" in {rows.at(i)}" if i else "")
            + f"; columns are: {_columns(rows.rows)}"
        )
    v = _plain(row[name])
    if v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip()):
        raise ValueError(f"{where}: {rows.at(i)}: field {name!r} (prompts.fields.{role}) is empty")
    return v


def _plain(v: Any) -> Any:
    """A numpy scalar (parquet) as the Python value it holds; anything else as it is."""
    if hasattr(v, "item") and getattr(v, "ndim", None) == 0:
        try:
            return v.item()
        except Exception:
            pass
    return v


def _text_field(rows: Rows, i: int, name: str, role: str, where: str) -> Any:
    """A question or answer: text or a finite number. A dict, list or true/false is refused: written as text it
    was a reference no completion states (`{'a': 1}`)."""
    v = _field(rows, i, name, role, where)
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise ValueError(
            f"{where}: {rows.at(i)}: field {name!r} (prompts.fields.{role}) is {_kind(v)}; it must be text or a number"
        )
    return v


def _kind(v: Any) -> str:
    name, text = type(v).__name__, repr(v)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({text[:60] + '...' if len(text) > 60 else text})"


def rows_to_examples(rows: Rows, cfg: Any, where: str) -> list[Example]:
    """question/answer rows -> Examples (template applied, answer extracted); a prompt seen before is dropped."""
    fields = _fields(cfg)
    qf, af = fields.get("question", "question"), fields.get("answer", "answer")
    extractor = _get(cfg, "answer_extractor", "none")
    template = resolve_template(_get(cfg, "template"))
    out = []
    for i in range(len(rows.rows)):
        q = _to_text(_text_field(rows, i, qf, "question", where))
        raw = _text_field(rows, i, af, "answer", where)
        ans = extract_answer(raw, extractor)
        if ans is None:
            raise ValueError(
                f"{where}: {rows.at(i)}: prompts.answer_extractor={extractor} found no "
                f"{'####' if extractor == 'gsm8k' else chr(92) + 'boxed{}'} in field {af!r}: {_to_text(raw)[:120]!r}"
            )
        out.append(Example(apply_template(template, q), ans, {"index": i}))
    return _drop_repeats(out, rows, where)


_INTEGER_TEXT = re.compile(r"\s*[-+]?[0-9]{1,18}\s*")


def _whole_number(v: Any) -> int | None:
    """An integer written as an int, a whole float (3.0) or integer text ("3"); None for anything else (3.7, true,
    "3.7", a list): casting turned 3.7 into 3 and true into 1."""
    v = _plain(v)
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and _INTEGER_TEXT.fullmatch(v):
        return int(v)
    return None


def _countdown_row(rows: Rows, i: int, nf: str, tf: str, where: str) -> tuple[list[int], int]:
    nums, target = _field(rows, i, nf, "nums", where), _field(rows, i, tf, "target", where)
    if isinstance(nums, str):  # csv: "[3, 5, 7]"
        try:
            nums = json_value(nums, where, 1)
        except ValueError:
            pass  # refused below, as text
    items = list(nums) if isinstance(nums, (list, tuple)) or getattr(nums, "ndim", 0) == 1 else [nums]
    ints = [_whole_number(n) for n in items]
    bad = [n for n, k in zip(items, ints) if k is None or abs(k) > MAX_LITERAL or items == [nums]]
    if not items or bad:
        raise ValueError(
            f"{where}: {rows.at(i)}: field {nf!r} (prompts.fields.nums) must be a list of whole numbers up to "
            f"{MAX_LITERAL:,} in size; it holds {_kind(bad[0]) if bad else 'nothing'}"
        )
    whole = _whole_number(target)
    if whole is None or abs(whole) > MAX_ABS:
        raise ValueError(
            f"{where}: {rows.at(i)}: field {tf!r} (prompts.fields.target) must be a whole number up to "
            f"{MAX_ABS:,} in size; it is {_kind(_plain(target))}"
        )
    return ints, whole


def countdown_rows_to_examples(rows: Rows, cfg: Any, where: str) -> list[Example]:
    """nums/target rows -> Countdown Examples; a puzzle seen before (the same numbers and target) is dropped."""
    fields = _fields(cfg)
    nf, tf = fields.get("nums", "nums"), fields.get("target", "target")
    template = resolve_template(_get(cfg, "template"))
    out = []
    for i in range(len(rows.rows)):
        nums, target = _countdown_row(rows, i, nf, tf, where)
        out.append(countdown_example(nums, target, template, {"index": i}))
    return _drop_repeats(out, rows, where)


def prompt_key(e: Example) -> Any:
    """What makes two examples the same prompt: a Countdown puzzle's numbers (in any order) and target, else the
    prompt text."""
    if "nums" in e.meta and "target" in e.meta:
        return tuple(sorted(e.meta["nums"])), e.meta["target"]
    return e.prompt


def _drop_repeats(examples: list[Example], rows: Rows, where: str) -> list[Example]:
    """The examples without a prompt seen earlier in the file, with a warning: a repeated prompt could land on
    both sides of the held-out split."""
    first: dict[Any, int] = {}
    out, repeats = [], []
    for e in examples:
        k = prompt_key(e)
        if k in first:
            repeats.append((e.meta["index"], first[k]))
        else:
            first[k] = e.meta["index"]
            out.append(e)
    if repeats:
        i, j = repeats[0]
        warnings.warn(
            f"{where}: {len(repeats)} row(s) repeat an earlier prompt ({rows.at(i)} repeats {rows.at(j)}); each "
            "prompt is kept once, so none is both trained on and held out",
            stacklevel=2,
        )
    return out


# ----------------------------------------------------------------------------- splitting
def _cap(xs: list, n: Any) -> list:
    return xs[:n] if n else xs


def _split(
    train: list[Example], eval_: list[Example] | None, cfg: Any, where: str, where_eval: str | None = None
) -> tuple[list, list]:
    seed = _get(cfg, "data_seed", 0)
    rng = random.Random(seed)
    if eval_ is None:
        items = list(train)
        rng.shuffle(items)
        frac = _get(cfg, "eval_fraction", 0.0)
        if not 0 <= frac < 1:
            raise ValueError(f"prompts.eval_fraction={frac} must be in [0, 1)")
        n_hold = max(1, round(frac * len(items))) if frac else int(_get(cfg, "n_eval", 0))
        if n_hold <= 0:
            raise ValueError(f"{where}: no eval split: set prompts.eval_fraction > 0 or prompts.n_eval > 0")
        eval_, train = items[:n_hold], items[n_hold:]
    else:
        train, eval_ = _without_held_out(train, eval_, where, where_eval or where), list(eval_)
        rng.shuffle(train)
        rng.shuffle(eval_)
    train, eval_ = _cap(train, _get(cfg, "n_train", 0)), _cap(eval_, _get(cfg, "n_eval", 0))
    for name, xs, w in (("train", train, where), ("eval", eval_, where_eval or where)):
        if not xs:
            raise ValueError(
                f"{w}: the {name} split is empty ({len(train)} train / {len(eval_)} eval examples); "
                "check the file/split, prompts.eval_fraction and prompts.n_train / prompts.n_eval"
            )
    return train, eval_


def _without_held_out(train: list[Example], eval_: list[Example], where: str, where_eval: str) -> list[Example]:
    """The train examples whose prompt is not held out (a separate eval file or split may repeat one)."""
    held = {prompt_key(e) for e in eval_}
    kept = [e for e in train if prompt_key(e) not in held]
    if len(kept) < len(train):
        warnings.warn(
            f"{where}: {len(train) - len(kept)} prompt(s) are also in the eval set ({where_eval}); they are dropped "
            "from training, so no prompt is both trained on and held out",
            stacklevel=3,
        )
    return kept


# ----------------------------------------------------------------------------- countdown generator
def countdown_question(nums: list[int], target: int) -> str:
    return (
        f"Using the numbers {list(nums)}, create an equation that equals {target}. You can use basic arithmetic "
        "operations (+, -, *, /) and each number can only be used once."
    )


def countdown_example(nums: list[int], target: int, template: str, meta: dict | None = None) -> Example:
    return Example(
        apply_template(template, countdown_question(nums, target)),
        encode_countdown(nums, target),
        {"nums": list(nums), "target": target, **(meta or {})},
    )


def countdown_puzzle(
    rng: random.Random,
    *,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 99,
    max_target: int = 100,
    tries: int = 1000,
) -> tuple[list[int], int, str]:
    """Numbers in 1..max_number and a target in 1..max_target reachable with each number exactly once.

    The target is built by a random expression: numbers are combined in a random order with random
    operators, keeping every intermediate a positive integer (classic Countdown rules). Returns
    (nums, target, a solution)."""
    for _ in range(tries):
        k = rng.randint(min_numbers, max_numbers)
        nums = [rng.randint(1, max_number) for _ in range(k)]
        pool = [(n, str(n)) for n in nums]
        while len(pool) > 1:
            (a, ea), (b, eb) = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
            ops = ["+", "*"] + (["-"] if a != b else []) + (["/"] if b and a % b == 0 and b != 1 else [])
            op = rng.choice(ops)
            if op == "-" and a < b:
                (a, ea), (b, eb) = (b, eb), (a, ea)
            v = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
            pool.append((v, f"({ea} {op} {eb})"))
        target, expr = pool[0]
        if 1 <= target <= max_target:
            return nums, target, expr[1:-1] if expr.startswith("(") else expr
    raise ValueError(f"could not generate a Countdown puzzle with target <= prompts.max_target={max_target}; raise it")


def countdown_splits(cfg: Any) -> tuple[list[Example], list[Example]]:
    n_train, n_eval = int(_get(cfg, "n_train", 0)), int(_get(cfg, "n_eval", 0))
    if n_train <= 0 or n_eval <= 0:
        raise ValueError(
            f"prompts.kind=countdown without prompts.path generates puzzles: set prompts.n_train > 0 and "
            f"prompts.n_eval > 0 (got {n_train} / {n_eval})"
        )
    lo, hi = int(_get(cfg, "min_numbers", 3)), int(_get(cfg, "max_numbers", 4))
    max_number, max_target = int(_get(cfg, "max_number", 99)), int(_get(cfg, "max_target", 100))
    if not 2 <= lo <= hi <= 8:
        raise ValueError(
            f"prompts.min_numbers={lo} / prompts.max_numbers={hi}: need 2 <= min_numbers <= max_numbers <= 8"
        )
    if max_number < 1 or max_target < 1:
        raise ValueError("prompts.max_number and prompts.max_target must be >= 1")
    template = resolve_template(_get(cfg, "template"))
    rng = random.Random(_get(cfg, "data_seed", 0))
    seen: set = set()
    out: list[list[Example]] = [[], []]
    for split, n in ((1, n_eval), (0, n_train)):  # eval first: its puzzles never repeat in train
        misses = 0
        while len(out[split]) < n:
            nums, target, sol = countdown_puzzle(
                rng, min_numbers=lo, max_numbers=hi, max_number=max_number, max_target=max_target
            )
            key = (tuple(sorted(nums)), target)
            if key in seen:
                misses += 1
                if misses > 100 * n + 1000:
                    raise ValueError(
                        f"prompts.kind=countdown: fewer than {n_train + n_eval} distinct puzzles with "
                        f"max_number={max_number}, max_target={max_target}; lower n_train/n_eval"
                    )
                continue
            seen.add(key)
            out[split].append(countdown_example(nums, target, template, {"solution": sol}))
    return out[0], out[1]


# ----------------------------------------------------------------------------- hub
NO_DATASETS = (
    "prompts.kind=hf needs the Hugging Face `datasets` package: pip install datasets (rlcompare's [hub] "
    "extra; or use a local copy: prompts.kind=file prompts.path=... [prompts.eval_path=...])"
)


def load_hf(cfg: Any, split: str) -> list[dict]:
    hf_id = _get(cfg, "hf_id")
    if not hf_id:
        raise ValueError("prompts.kind=hf needs prompts.hf_id (e.g. openai/gsm8k)")
    try:
        import datasets
    except ImportError:
        raise ValueError(NO_DATASETS) from None
    try:
        ds = datasets.load_dataset(hf_id, _get(cfg, "hf_config"), split=split)
    except Exception as e:
        raise ValueError(
            f"prompts.hf_id={hf_id!r} (config {_get(cfg, 'hf_config')!r}, split {split!r}) could not be "
            f"loaded: {type(e).__name__}: {e}"
        ) from None
    return ds.to_list() if hasattr(ds, "to_list") else [dict(r) for r in ds]


# ----------------------------------------------------------------------------- entry point
def build(cfg: Any) -> PromptSplits:
    kind = _get(cfg, "kind")
    path, eval_path = _get(cfg, "path"), _get(cfg, "eval_path")
    countdown = kind == "countdown"
    to_examples = countdown_rows_to_examples if countdown else rows_to_examples
    if kind == "file" or (countdown and path):
        where, where_eval = f"prompts.path={path!r}", f"prompts.eval_path={eval_path!r}"
        train = to_examples(read_rows(path, "prompts.path"), cfg, where)
        ev = to_examples(read_rows(eval_path, "prompts.eval_path"), cfg, where_eval) if eval_path else None
        train, ev = _split(train, ev, cfg, where, where_eval if eval_path else None)
    elif countdown:
        train, ev = countdown_splits(cfg)
    elif kind == "hf":
        hf_id, tr_split, ev_split = _get(cfg, "hf_id"), _get(cfg, "train_split", "train"), _get(cfg, "eval_split")
        where, where_eval = f"prompts.hf_id={hf_id!r} split {tr_split!r}", f"prompts.hf_id={hf_id!r} split {ev_split!r}"
        train = to_examples(Rows(load_hf(cfg, tr_split)), cfg, where)
        ev = to_examples(Rows(load_hf(cfg, ev_split)), cfg, where_eval) if ev_split else None
        train, ev = _split(train, ev, cfg, where, where_eval if ev_split else None)
    else:
        raise ValueError(f"prompts.kind={kind!r} is not accepted; use one of: arithmetic, countdown, file, hf")
    return PromptSplits(
        train=train, eval=ev, chat=bool(_get(cfg, "chat", False)), system_prompt=_get(cfg, "system_prompt")
    )
