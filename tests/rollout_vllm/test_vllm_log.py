"""With vLLM's own logging set up (it replaces its handlers when an engine starts), what `rlcompare.rollout.vllm_log`
hides stays hidden and a real failure in the same words still shows: in a process of its own, an engine is built on
a tied tiny model and pushed to, then a weight-bearing layer's "Failed to load weights" and a chat warmup failing
for another reason than the missing tokenizer are logged where vLLM logs them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="rollout.engine=vllm needs the [vllm] extra")

from rlcompare.rollout.vllm_log import NOTE  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import logging, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from rlcompare.rollout.vllm_engine import VllmSampler

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=True))
    engine = VllmSampler(model, max_model_len=64, max_num_seqs=32, seed=0)
    for _ in range(2):
        engine.push(model)
    print("BUILT AND PUSHED", flush=True)
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").warning(
        "%s: Failed to load weights", "QKVParallelLinear")
    try:
        raise RuntimeError("a template that does not compile")
    except RuntimeError:
        logging.getLogger("vllm.renderers.base").warning("Chat template warmup failed", exc_info=True)
    """
)


def test_the_harmless_messages_stay_hidden_and_a_real_failure_shows(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("VLLM_LOGGING_LEVEL", None)
    done = subprocess.run(  # one stream, in order: vLLM logs to stdout, rlcompare's note goes to stderr
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=500,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    before, _, after = done.stdout.partition("BUILT AND PUSHED")
    assert "Failed to load weights" not in before and "Traceback" not in before, before[-3000:]
    assert done.stdout.count(NOTE) == 1
    assert "QKVParallelLinear: Failed to load weights" in after
    assert "Chat template warmup failed" in after and "a template that does not compile" in after
