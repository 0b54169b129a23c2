"""Per-step throughput metrics (`rlcompare.train.throughput`): the model FLOP count worked by hand, and a run's
rows holding every `perf/` and `memory/` entry, positive and consistent with the row's times and token counts."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlcompare.config import validate
from rlcompare.train import throughput
from rlcompare.train.trainer import Trainer

PERF_KEYS = (
    "perf/rollout_tokens_per_s",
    "perf/update_tokens_per_s",
    "perf/model_tflop",
    "perf/peak_tflop_per_s",
    "perf/mfu",
    "perf/rollout_share",
    "memory/peak_gib",
)


@pytest.mark.parametrize("tied", [True, False])
def test_product_params_count_every_product_and_not_the_input_embedding(tied):
    cfg = AutoConfig.for_model(
        "llama",
        vocab_size=10,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=16,
        tie_word_embeddings=tied,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    # q, k, v, o: 4 x 8 x 8 = 256; gate, up, down: 3 x 8 x 16 = 384; two layer norms and the final: 3 x 8 = 24;
    # the LM head 10 x 8 = 80 (tied or not: the embedding lookup is no product)
    assert throughput.product_params(model) == 256 + 384 + 24 + 80


def test_step_flops_worked_by_hand():
    t = throughput.StepTokens(generated=3, prefilled=2, updated=3, update_prompt=2, extra_forwards=1)
    # rollout 2 x 10 x (3 + 2) = 100; update 6 x 10 x 5 = 300; one more forward 2 x 10 x 5 = 100
    assert throughput.step_flops(10, t) == 500
    critic = throughput.StepTokens(generated=3, prefilled=2, updated=3, update_prompt=2, extra_forwards=1, critic=True)
    assert throughput.step_flops(10, critic) == 800  # the critic's forward and backward: another 300


def test_perf_metrics_of_one_step_worked_by_hand():
    t = throughput.StepTokens(generated=600, prefilled=40, updated=500, update_prompt=40, extra_forwards=0)
    m = throughput.perf_metrics(tokens=t, rollout_s=3.0, update_s=1.0, step_s=4.0, flops=8e12, peak=1e12, ranks=2)
    assert m["perf/rollout_tokens_per_s"] == 200  # 600 / 3
    assert m["perf/update_tokens_per_s"] == 500
    assert m["perf/mfu"] == 1.0  # 8e12 / (4 s x 1e12 x 2 devices)
    assert m["perf/rollout_share"] == 0.75
    none = throughput.StepTokens(generated=600, prefilled=40, updated=0, update_prompt=0, extra_forwards=0)
    no_update = throughput.perf_metrics(tokens=none, rollout_s=3, update_s=1, step_s=4, flops=1, peak=1, ranks=1)
    assert no_update["perf/update_tokens_per_s"] is None


def test_the_peak_probe_is_positive_and_measured_once():
    throughput.peak_flops.cache_clear()
    first = throughput.peak_flops("cpu", torch.float32)
    assert first > 0
    assert throughput.peak_flops("cpu", torch.float32) == first  # cached: once per process and device
    assert throughput.peak_flops.cache_info().misses == 1


@pytest.mark.parametrize("extra", [(), ("algorithm.kl.coef=0.05", "trainer.updates_per_rollout=2")])
def test_every_row_holds_consistent_throughput(compose, tmp_path, extra):
    cfg = validate(compose("budget.max_steps=2", *extra))
    tr = Trainer(cfg, tmp_path / "run")
    n_params = throughput.product_params(tr.policy.model)
    B = cfg.trainer.prompts_per_step * cfg.trainer.group_size
    for _ in range(2):
        row = tr.step()
        assert all(row[k] is not None and row[k] > 0 for k in PERF_KEYS), {k: row.get(k) for k in PERF_KEYS}
        assert row["perf/rollout_tokens_per_s"] * row["time/rollout_s"] == pytest.approx(row["tokens/step"])
        trained = row["length/mean"] * B  # one round: the batch is what was sampled
        assert row["perf/update_tokens_per_s"] * row["time/update_s"] == pytest.approx(trained)
        assert row["perf/rollout_share"] == pytest.approx(row["time/rollout_s"] / row["time/step_s"])
        peak = row["perf/peak_tflop_per_s"] * 1e12
        assert row["perf/mfu"] == pytest.approx(row["perf/model_tflop"] * 1e12 / (row["time/step_s"] * peak))
        # at least 2N per generated token and 6N per trained one (prompts and the reference's forward come on top)
        assert row["perf/model_tflop"] * 1e12 >= n_params * (2 * row["tokens/step"] + 6 * trained)
