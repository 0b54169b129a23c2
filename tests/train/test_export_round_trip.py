"""`rlcompare export` used as transformers' docs say gives the run's own answers: greedy generation from
`tok(prompt)` (the default tiny run) or `tok.apply_chat_template(...)` (a chat model, `model=hf`), on the CPU in
fp32, reproduces the greedy eval completions the run logged at its last step, word for word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlcompare.cli import main as cli_main
from rlcompare.train.run import train
from tests.models.qwen_folder import qwen_tokenizer

LOGGED = ["trainer.n_samples_logged=12", "prompts.n_eval=12", "logger=none", "trainer.progress=false"]


def _last_eval(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    last = max(r["step"] for r in rows)
    return [r for r in rows if r["step"] == last]


def _exported(run: Path, out: Path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert cli_main(["export", str(run), "--out", str(out)]) == 0
    assert "exported step 2 of" in capsys.readouterr().err
    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(out)


def _greedy(model, tok, ids: list[int]) -> str:
    """What a newcomer writes: generate with the folder's generation_config (its end tokens), greedy."""
    prompt = torch.tensor([ids])
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False)
    return tok.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
def test_the_default_tiny_runs_export_answers_as_the_run_did(compose, tmp_path, capsys):
    s = train(
        compose("budget=tiny", "budget.max_steps=2", "trainer.eval_every=2", "trainer.threads=1", *LOGGED, fast=False)
    )
    run = Path(s["run_dir"])
    model, tok = _exported(run, tmp_path / "out", capsys)
    assert tok.model_max_length == model.config.max_position_embeddings
    logged = _last_eval(run)
    assert len(logged) == 12 and sum(r["correct"] for r in logged) >= 3  # answers, not noise: the check can fail
    got = [_greedy(model, tok, tok(r["prompt"]).input_ids) for r in logged]
    assert got == [r["completion"] for r in logged]


def _tiny_chat_model(folder: Path) -> str:
    """A random 2-layer Qwen2 with the real Qwen2.5 tokenizer and ChatML (no BOS; <|im_end|> and <|endoftext|> end)."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tok = qwen_tokenizer()
    end = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=end,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=end, pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_a_chat_models_export_answers_as_the_run_did(compose, tmp_path, capsys):
    base = _tiny_chat_model(tmp_path / "chat")
    system = "Answer with a number."
    s = train(
        compose(
            "model=hf", f"model.name_or_path={base}", "model.dtype=float32", "budget=tiny", "budget.max_steps=2",
            "budget.max_new_tokens=6", "budget.max_prompt_tokens=48", "++prompts.chat=true",
            f"++prompts.system_prompt='{system}'", "verifier=exact_match", "trainer.prompts_per_step=2",
            "trainer.group_size=2", "trainer.eval_every=2", "trainer.threads=1", *LOGGED,
            "trainer.unhealthy=warn", fast=False,  # an untrained model solves nothing: the export is checked here
        )
    )  # fmt: skip
    run = Path(s["run_dir"])
    model, tok = _exported(run, tmp_path / "out", capsys)
    gen = json.loads((Path(tmp_path / "out") / "generation_config.json").read_text())
    assert sorted(gen["eos_token_id"]) == sorted(model.config.eos_token_id)
    logged = _last_eval(run)
    assert len(logged) == 12 and all(r["completion"] for r in logged)  # 6 tokens each: the check can fail
    msgs = [[{"role": "system", "content": system}, {"role": "user", "content": r["prompt"]}] for r in logged]
    ids = [tok.apply_chat_template(m, add_generation_prompt=True, return_dict=True)["input_ids"] for m in msgs]
    assert [_greedy(model, tok, i) for i in ids] == [r["completion"] for r in logged]
