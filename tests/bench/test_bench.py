"""`rlcompare bench`: FLOP counting, size specs, and the table / JSON output on a fake result (TRL never runs here)."""

import json
import math

import pytest

from rlcompare.bench import against_trl as bench


def test_forward_flops_dense_and_attention():
    # prefill: 2 rows x 3 tokens, no cache: causal pairs per row 1+2+3 = 6
    f = bench.forward_flops(n_params=100, n_layers=2, hidden=8, batch=2, seq=3)
    assert f == 2 * 100 * 2 * 3 + 4 * 2 * 8 * (2 * 6)
    # one decode token attending to 10 positions (9 cached + itself)
    f = bench.forward_flops(n_params=100, n_layers=2, hidden=8, batch=4, seq=1, ctx=10)
    assert f == 2 * 100 * 4 + 4 * 2 * 8 * (4 * 10)
    # decode with a cache costs the same dense work as feeding the token without one
    assert bench.forward_flops(50, 1, 4, 1, 1, ctx=1) == 2 * 50 + 4 * 4 * 1


def test_flop_counter_weights_grad_forwards_3x():
    c = bench.FlopCounter(n_params=10, n_layers=1, hidden=2)
    c.record(batch=1, seq=4, ctx=4, grad=False)
    no_grad = c.snapshot()
    c.record(batch=1, seq=4, ctx=4, grad=True)
    assert c.snapshot() - no_grad == pytest.approx(3 * no_grad)
    assert (c.tokens_no_grad, c.tokens_grad, c.calls) == (4, 4, 2)


def test_flop_counter_hook_on_a_real_llama():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    c = bench.FlopCounter(n, 1, 32).attach(model)
    ids = torch.randint(0, 16, (3, 5))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert c.calls == 1 and c.tokens_no_grad == 15
    assert c.snapshot() == bench.forward_flops(n, 1, 32, 3, 5, 5)
    model(input_ids=ids).logits.sum().backward()
    assert c.tokens_grad == 15
    assert c.snapshot() == 4 * bench.forward_flops(n, 1, 32, 3, 5, 5)


def test_flop_counter_counts_static_and_transformers_decoding_alike():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlcompare.rollout import sample

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    n = sum(p.numel() for p in model.parameters())
    ids, mask = torch.randint(1, 16, (2, 4)), torch.ones((2, 4), dtype=torch.long)
    counted = {}
    for kv in ("auto", "dynamic"):
        c = bench.FlopCounter(n, 1, 32).attach(model)
        sample(model, ids, mask, max_new_tokens=3, eos_id=99, pad_id=0, repeats=2, kv_cache=kv, flop_observer=c)
        c._handle.remove()
        counted[kv] = (c.calls, c.tokens_no_grad, c.snapshot())
    # prefill of 2 prompts x 4 tokens, then 2 decode steps of 4 rows x 1 token at contexts 5 and 6
    want = (
        bench.forward_flops(n, 1, 32, 2, 4, 4)
        + bench.forward_flops(n, 1, 32, 4, 1, 5)
        + bench.forward_flops(n, 1, 32, 4, 1, 6)
    )
    assert counted["auto"] == counted["dynamic"] == (3, 16, want)


def test_model_specs_and_param_counts():
    spec = bench.model_spec("0.5M")
    assert spec["hidden_size"] == 128 and spec["num_layers"] == 2 and spec["num_heads"] == 4
    assert spec["intermediate_size"] == 512 and spec["max_new_tokens"] == 16
    assert bench.model_spec("25M")["max_new_tokens"] == 32
    vocab = 82  # build_char_tokenizer()
    for size, want in (("0.5M", 0.5e6), ("4.2M", 4.2e6), ("25M", 25e6)):
        n = bench.llama_param_count(bench.model_spec(size), vocab)
        assert abs(n - want) / want < 0.1, (size, n)
    with pytest.raises(ValueError, match="unknown size"):
        bench.model_spec("1B")


def test_param_count_matches_the_built_model():
    pytest.importorskip("transformers")
    from argparse import Namespace

    from transformers import LlamaForCausalLM

    from rlcompare.models import build_char_tokenizer, tiny_model_config

    tok = build_char_tokenizer()
    spec = bench.model_spec("0.5M")
    model = LlamaForCausalLM(tiny_model_config(Namespace(**spec), tok))
    assert sum(p.numel() for p in model.parameters()) == bench.llama_param_count(spec, len(tok))


def test_informative_frac():
    assert bench.informative_frac([0, 0, 1, 0, 1, 1, 1, 1], 4) == 0.5
    assert bench.informative_frac([0.1] * 8, 8) == 0.0


def _fake(tool, step_s, flops, tokens, mem):
    return {
        "tool": tool,
        "params": 1000,
        "step_s": step_s,
        "flops": flops,
        "tokens": tokens,
        "informative": [0.5] * len(step_s),
        "peak_mem_mib": mem,
        "threads": 2,
    }


def test_table_and_json_on_a_fake_result():
    rlc = _fake("rlcompare", [9.0, 1.0, 2.0, 3.0], [1e9] * 4, [100] * 4, 500.0)  # first step is warm-up
    trl = _fake("trl", [9.0, 4.0, 6.0, 8.0], [1e9] * 4, [100] * 4, 700.0)
    row = bench.result_row(
        "0.5M", 535424, steps=3, warmup=1, threads=2, device="cpu", peak_gflops=10.0, rlc=rlc, trl_res=trl, weights="/w"
    )
    assert row["rlcompare_s_per_step"] == 2.0 and row["trl_s_per_step"] == 6.0
    assert row["ratio"] == 3.0
    assert row["rlcompare_tokens_per_s"] == pytest.approx(300 / 6.0, abs=0.1)
    assert row["rlcompare_gflops"] == pytest.approx(3.0 / 6.0, abs=1e-3)  # 3 GFLOP over 6 s
    assert row["trl_peak_frac"] == pytest.approx(3.0 / 18.0 / 10.0, abs=1e-4)
    assert row["rlcompare_peak_mem_mib"] == 500.0
    line = bench.json_line(row)
    parsed = json.loads(line)
    for key in (
        "size",
        "params",
        "trl_s_per_step",
        "rlcompare_s_per_step",
        "ratio",
        "matmul_peak_gflops",
        "rlcompare_gflops",
        "trl_gflops",
        "rlcompare_tokens_per_s",
        "trl_tokens_per_s",
        "rlcompare_peak_mem_mib",
        "trl_peak_mem_mib",
        "weights",
    ):
        assert key in parsed
    assert "\n" not in line
    table = bench.format_table([row])
    lines = table.splitlines()
    assert "speed-up" in lines[0] and len(lines) == 3
    assert "3.00x" in lines[2] and "0.54M" in lines[2]


def test_without_trl_the_row_has_no_ratio():
    rlc = _fake("rlcompare", [1.0, 1.0], [1e9, 1e9], [10, 10], 100.0)
    row = bench.result_row(
        "4.2M",
        4_200_000,
        steps=1,
        warmup=1,
        threads=1,
        device="cpu",
        peak_gflops=5.0,
        rlc=rlc,
        trl_res=None,
        weights="/w",
    )
    assert row["ratio"] is None and row["trl_s_per_step"] is None and row["trl_gflops"] is None
    assert row["rlcompare_s_per_step"] == 1.0
    assert "-" in bench.format_table([row]).splitlines()[2]
    err = bench.result_row(
        "4.2M",
        1,
        steps=1,
        warmup=0,
        threads=1,
        device="cpu",
        peak_gflops=5.0,
        rlc=rlc,
        trl_res={"error": "exit 1: boom"},
        weights="/w",
    )
    assert err["trl_error"] == "exit 1: boom" and err["ratio"] is None
    assert math.isclose(err["rlcompare_s_per_step"], 1.0)


def test_parse_args_defaults():
    a = bench.parse_args([])
    assert a.sizes == "0.5M,4.2M,25M" and a.steps == 5 and a.warmup == 2 and a.device == "cpu" and a.repeats == 3
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
