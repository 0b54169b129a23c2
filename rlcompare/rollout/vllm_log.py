"""vLLM's log inside an rlcompare run (`rollout.engine=vllm`): its INFO lines off unless asked for, and the warnings
known to be harmless in rlcompare's use of the engine hidden, each for a stated reason; anything else it says
(an error, a warning not listed here, a listed message about another layer or exception) shows as vLLM wrote it.

A 10-step run on the CPU build printed 101 lines of vLLM's against rlcompare's 3: its build's INFO lines, a chat
template warmup's traceback, and "Failed to load weights" twice on every weight push. Each hidden message is matched
by the logger that emits it, its format string and, where that is not enough, its arguments or exception, so that
a real failure under the same words still shows (a layer holding weights that failed to load). A vLLM release that
moves a message to another module shows it again: noise, never a hidden error. `VLLM_LOGGING_LEVEL=DEBUG` (or
INFO) set by the user shows vLLM's log at that level; DEBUG also turns every filter here off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

LEVEL_VAR = "VLLM_LOGGING_LEVEL"  # vLLM's own setting of its log level (read when vllm configures its logging)
NOTE = (
    "[rlcompare] vLLM: its INFO log and its warnings known to be harmless here are hidden (rlcompare/rollout/"
    "vllm_log.py lists each and why; VLLM_LOGGING_LEVEL=DEBUG shows everything)"
)


@dataclass(frozen=True)
class Harmless:
    """A vLLM message hidden in rlcompare runs: the logger that emits it, how its format string starts, and (when
    the words alone could also report a real failure) a test of the record that must hold as well."""

    logger: str
    starts: str
    why: str
    holds: Optional[Callable[[logging.LogRecord, bool], bool]] = None  # (record, tied head) -> harmless


def _no_weights_of_its_own(record: logging.LogRecord, tied: bool) -> bool:
    """The layer named holds no tensor the push carries: a rotary embedding (its cos/sin cache is computed from the
    config), or the LM head of a model that ties it to the embedding (`_reprocess_head` re-derives it)."""
    layer = str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""
    return layer.endswith("RotaryEmbedding") or (tied and layer == "ParallelLMHead")


def _no_tokenizer(record: logging.LogRecord, tied: bool) -> bool:
    """The warmup failed because rlcompare builds the engine without a tokenizer, and for no other reason."""
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, ValueError) and "skip_tokenizer_init" in str(exc)


HARMLESS = (
    Harmless(
        "vllm.model_executor.model_loader.reload.layerwise",
        "%s: Failed to load weights",
        "each weight push: layers that hold no pushed tensor keep theirs (rotary cache; a tied LM head)",
        _no_weights_of_its_own,
    ),
    Harmless(
        "vllm.renderers.base",
        "Chat template warmup failed",
        "the engine is built with skip_tokenizer_init: rlcompare tokenizes and never renders a chat through vLLM",
        _no_tokenizer,
    ),
    Harmless("vllm.renderers.base", "Using None for BOS token id", "rlcompare passes the prompt ids with BOS"),
    Harmless("vllm.renderers.base", "Using None for EOS token id", "rlcompare passes stop_token_ids per request"),
    Harmless(
        "vllm.v1.worker.cpu_worker",
        "CPU backend doesn't allow to use `torch.set_num_threads`",
        "the threads stay as they were, as rlcompare wants (vllm_engine.threads_kept)",
    ),
    Harmless("vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD", "a speed hint of the CPU build"),
    Harmless("vllm.config.vllm", "Enforce eager set", "rlcompare asks for eager mode on the CPU build"),
    Harmless("vllm.config.vllm", "Inductor compilation was disabled", "follows from eager mode"),
    Harmless("vllm.config.vllm", "Model Runner V2 requires Triton", "the CPU build runs vLLM's V1 runner"),
    Harmless("vllm.platforms.cpu", "Triton is not installed", "the CPU build runs without Triton"),
    Harmless("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU", "as above"),
)


class HarmlessFilter(logging.Filter):
    """Drops the records `HARMLESS` lists for its logger; the first drop prints `NOTE` once (stderr)."""

    def __init__(self, name: str, tied: bool):
        super().__init__()
        self.known = [h for h in HARMLESS if h.logger == name]
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        for h in self.known:
            if str(record.msg).startswith(h.starts) and (h.holds is None or h.holds(record, self.tied)):
                _note_once()
                return False
        return True


_noted = [False]


def _note_once() -> None:
    if not _noted[0]:
        _noted[0] = True
        print(NOTE, file=sys.stderr, flush=True)


def quiet_vllm(tied: bool) -> None:
    """Before vllm is imported and its engine built: vLLM's log level WARNING unless the user set one, and a
    `HarmlessFilter` on each emitting logger (a logger's own filters outlive vLLM's logging setup, which replaces
    the handlers of its `vllm` logger when an engine starts). `tied`: the policy ties its LM head to the embedding.
    Called again (another engine), it sets the filters' `tied` anew."""
    user_level = os.environ.get(LEVEL_VAR)
    if user_level is None:
        os.environ[LEVEL_VAR] = "WARNING"
        logging.getLogger("vllm").setLevel(logging.WARNING)  # messages logged before vLLM configures its logging
    if (user_level or "").upper() == "DEBUG":
        return
    for name in dict.fromkeys(h.logger for h in HARMLESS):
        log = logging.getLogger(name)  # the module's own logger once vllm imports it (getLogger is by name)
        for f in [f for f in log.filters if isinstance(f, HarmlessFilter)]:
            log.removeFilter(f)
        log.addFilter(HarmlessFilter(name, tied))


@contextlib.contextmanager
def build_warnings_hidden():
    """Around the engine's build: the FutureWarning torch raises when vLLM's kernel scan reads the deprecated
    `torch.distributed.reduce_op` attribute of every loaded module (vLLM's own access; nothing of rlcompare's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning
        )
        yield
