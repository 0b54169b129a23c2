"""`verifier=reasoning_gym`: a reasoning-gym dataset's own `score_answer`, against the entry the prompt came from.

The reference (`Example.answer` of `prompts=reasoning_gym`, rlcompare/data/gym_tasks.py) is JSON naming the entry:
`{"task", "config", "seed", "size", "index", "answer"}`. The verifier rebuilds that dataset (cached per process) and
regenerates entry `index` (reasoning-gym generates each entry from its seed and index); an entry whose answer differs
from the recorded one is an error, never a silent mismatch.

The final answer (docs/verifiers.md): every non-empty `<answer>...</answer>` content, else every `\\boxed{}` content,
else the whole completion, stripped (in the last `max_chars`). Several different ones must each score 1 (a hedge
scores 0). reward = 1 when `score_answer` gives 1 (for every span), else 0; `partial_credit: true` passes the
dataset's own partial reward (the lowest over the spans).

Model output is untrusted, and several reasoning-gym scorers pass the answer to `eval` or sympy's `parse_expr`
(countdown, puzzle24, n_queens, spiral_matrix, the integration tasks...). So while an answer is scored, an audit
hook (`sys.addaudithook`, installed once in the scoring process, idle otherwise):
* refuses any compile of code unless the answer is plain math (`plain_math`: digits, operators, brackets, single
  letters and a few math names; no quotes, underscores, attribute access) or is the entry's own answer verbatim
  (code the dataset wrote): the scorer cannot evaluate it, and the answer scores 0 (not an error). So an answer
  that is not plain math scores 0 on a task whose scorer compiles code unless it is the reference, letter for
  letter (number_sorting's list of quoted numbers in other spacing, n_queens' board as a Python list);
* refuses starting processes, signals, sockets, file writes and deletes, ctypes, whatever the scorer does.
It runs in worker processes (not bounded by construction) with `verifier.timeout_s` per completion and
`verifier.batch_timeout_s` per batch, like math_verify (rlcompare/rewards/pool.py).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass

from rlcompare.rewards.answers import MAX_CANDIDATES, distinct, marked_spans
from rlcompare.rewards.pool import RIGHT, WRONG, Score
from rlcompare.rewards.registry import knob, register_verifier
from rlcompare.rewards.text import DEFAULT_MAX_CHARS
from rlcompare.rewards.verifiers import Verifier

REFERENCE_KEYS = ("task", "config", "seed", "size", "index", "answer")
# Names a plain-math answer may hold besides single letters (variables): sympy/Python spellings of functions
MATH_NAMES = frozenset(
    "sin cos tan cot sec csc asin acos atan sinh cosh tanh exp log ln sqrt pi oo abs Abs True False and or not".split()
)
_PLAIN_CHARS = re.compile(r"[0-9A-Za-z\s+\-*/^().,%=<>!&|~\[\]]*")
_NAME = re.compile(r"[A-Za-z]+")
_ATTRIBUTE = re.compile(r"\.\s*[A-Za-z]")
# Audit events refused while an answer is scored (prefixes): processes, signals, network, file changes, native code
_REFUSED_EVENTS = (
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.symlink",
    "os.link",
    "os.putenv",
    "os.unsetenv",
    "os.chdir",
    "subprocess.",
    "pty.",
    "socket.",
    "ctypes.",
    "shutil.",
    "webbrowser.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
)
_WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000  # O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND (Linux)


class RefusedByGuard(PermissionError):
    """What the audit hook raises inside a scorer that tried something refused."""


def plain_math(text: str) -> bool:
    """Whether `text` is plain math that an `eval` cannot turn into code: digits, operators, brackets, whitespace,
    single-letter names and MATH_NAMES; no quotes, underscores, braces, backslashes or attribute access."""
    if len(text) > 2000 or not _PLAIN_CHARS.fullmatch(text) or _ATTRIBUTE.search(text):
        return False
    return all(len(n) == 1 or n in MATH_NAMES for n in _NAME.findall(text))


# ----------------------------------------------------------------------------- the audit guard
_STATE = threading.local()  # .answer: the answer being scored in this thread (None: not scoring)
_HOOKED = False


def _audit(event: str, args: tuple) -> None:
    answer = getattr(_STATE, "answer", None)
    if answer is None:
        return
    if event == "compile":
        if not _STATE.may_compile:
            _STATE.refused = True
            raise RefusedByGuard("reasoning_gym: the scorer compiles code and the answer is not plain math")
        return
    if event.startswith(_REFUSED_EVENTS) or (event == "open" and _writes(args)):
        _STATE.refused = True
        raise RefusedByGuard(f"reasoning_gym: {event} refused while scoring")


def _writes(args: tuple) -> bool:
    mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _install_guard() -> None:
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)  # permanent by design (audit hooks cannot be removed); idle outside scoring
        _HOOKED = True


def guarded_score(dataset, answer: str, entry: dict) -> tuple[float | None, bool]:
    """(dataset.score_answer(answer, entry), refused): refused when the guard stopped something it tried."""
    _install_guard()
    reference = entry.get("answer")
    may_compile = plain_math(answer) or (reference is not None and answer == str(reference).strip())
    _STATE.answer, _STATE.may_compile, _STATE.refused = answer, may_compile, False
    try:
        value = dataset.score_answer(answer, entry)
    except RefusedByGuard:
        value = None
    finally:
        _STATE.answer = None
    return value, bool(_STATE.refused)


# ----------------------------------------------------------------------------- references
def encode_reference(task: str, config: dict, seed: int, size: int, index: int, answer) -> str:
    ref = {"task": task, "config": config, "seed": seed, "size": size, "index": index}
    return json.dumps({**ref, "answer": None if answer is None else str(answer)}, sort_keys=True)


def decode_reference(text: str) -> dict:
    ref = json.loads(text)
    if not isinstance(ref, dict) or set(ref) != set(REFERENCE_KEYS):
        raise ValueError(f"not a reasoning_gym reference (keys {', '.join(REFERENCE_KEYS)}): {str(text)[:80]!r}")
    if not isinstance(ref["task"], str) or not isinstance(ref["config"], dict):
        raise ValueError("a reasoning_gym reference needs a task name and a config mapping")
    if not all(isinstance(ref[k], int) and not isinstance(ref[k], bool) for k in ("seed", "size", "index")):
        raise ValueError("a reasoning_gym reference's seed, size and index are integers")
    if not 0 <= ref["index"] < ref["size"]:
        raise ValueError(f"a reasoning_gym reference's index {ref['index']} is outside its size {ref['size']}")
    return ref


def make_dataset(task: str, config: dict, seed: int, size: int):
    """reasoning-gym's dataset `task` built with `config`, `seed` and `size` (imports reasoning-gym)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(task, **config, seed=seed, size=size)


# ----------------------------------------------------------------------------- the verifier
@dataclass(frozen=True)
class ReasoningGymSettings:
    max_chars: int = DEFAULT_MAX_CHARS
    partial_credit: bool = knob(False, "the dataset's partial reward instead of 1 only for a full score")

    def check(self, where: str = "verifier") -> None:
        pass  # a bool (the registry checks each value's type against its default's)


@register_verifier("reasoning_gym", settings=ReasoningGymSettings)
class ReasoningGym(Verifier):
    name = "reasoning_gym"
    bounded = False  # a dataset's scorer may be slow (sympy): worker processes with timeouts

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS, partial_credit: bool = False):
        try:
            import reasoning_gym  # noqa: F401
        except ImportError as e:
            raise ValueError(
                "verifier.name=reasoning_gym needs the reasoning-gym package: pip install -e '.[gym]'"
            ) from e
        self.max_chars, self.partial_credit = int(max_chars), bool(partial_credit)

    def warm(self) -> None:
        """Import reasoning-gym (and the guard) up front, in a fresh worker before it reports ready."""
        import reasoning_gym  # noqa: F401

        _install_guard()

    def spans(self, completion: str) -> list[str]:
        tail = completion[-self.max_chars :]
        kind, spans = marked_spans(tail, ("answer", "boxed"))
        spans = spans if kind is not None else ([tail] if tail.strip() else [])
        return [s.strip() for s in distinct(spans)]

    def _entry(self, ref: dict):
        """(dataset, entry) for the reference, the dataset cached per (task, config, seed, size)."""
        cache = self.__dict__.setdefault("_datasets", {})
        key = json.dumps([ref["task"], ref["config"], ref["seed"], ref["size"]], sort_keys=True)
        if key not in cache:
            if len(cache) >= 8:
                cache.clear()
            cache[key] = make_dataset(ref["task"], ref["config"], ref["seed"], ref["size"])
        dataset = cache[key]
        entry = dataset[ref["index"]]
        got = None if entry.get("answer") is None else str(entry["answer"])
        if got != ref["answer"]:
            raise ValueError(f"reasoning_gym: entry {ref['index']} of {ref['task']} regenerated with another answer")
        return dataset, entry

    def score(self, completion: str, answer: str) -> Score:
        ref = decode_reference(answer)  # a bad reference raises: an error in score_batch
        dataset, entry = self._entry(ref)
        spans = self.spans(str(completion))
        if not spans or len(spans) > MAX_CANDIDATES:
            return WRONG
        rewards = []
        for span in spans:
            value, refused = guarded_score(dataset, span, entry)
            if refused or value is None:
                return WRONG
            rewards.append(float(value))
        low = min(rewards)
        if low >= 1.0:
            return RIGHT
        return Score(max(0.0, low), False) if self.partial_credit else WRONG
