"""`rlcompare export` and `trainer.export_final`: the exported folder loads with plain transformers (and peft for
`--adapter`) and gives the trainer's logits on fixed inputs, for full fine-tuning (the embedded tiny model and its
character tokenizer) and LoRA (a tiny Qwen2 saved locally)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlcompare.cli import main as cli_main
from rlcompare.config import ConfigError, validate
from rlcompare.train import checkpoint
from rlcompare.train.export import export_run
from rlcompare.train.run import train
from rlcompare.train.trainer import Trainer

TEXTS = ["3+4=", "12+19=7", "0+0="]


def _trainer(compose, run_dir: Path, *overrides, fast: bool = True) -> Trainer:
    cfg = validate(compose(*overrides, fast=fast))
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))  # what train() writes
    return Trainer(cfg, run_dir)


def _logits(model, tokenizer) -> torch.Tensor:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        return (
            model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits.float()
            * enc.attention_mask[..., None]
        )


def _load(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), tok


def _trained(tr: Trainer, steps: int = 2) -> torch.Tensor:
    """Train `steps` steps and save a checkpoint; the policy's logits before training."""
    tok = tr.policy.tokenizer
    before = _logits(tr.policy.model.eval(), tok)
    for _ in range(steps):
        tr.step()
    checkpoint.save(tr, keep=2)
    tr.policy.model.eval()
    return before


def test_full_fine_tuning_export_gives_the_trainers_logits(compose, tmp_path):
    tr = _trainer(compose, tmp_path / "run", "trainer.lr=1e-2")
    before = _trained(tr)
    out = tmp_path / "exported"
    assert cli_main(["export", str(tr.run_dir), "--out", str(out)]) == 0
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pth")) for f in files)
    model, tok = _load(out)
    want = _logits(tr.policy.model, tr.policy.tokenizer)
    assert (want - before).abs().max() > 1e-3  # training moved the weights: the comparison can fail
    assert torch.allclose(_logits(model, tr.policy.tokenizer), want, atol=1e-5)
    # the exported tokenizer encodes as training did: BOS in front (encode_prompts prepends it), a finite length
    assert tok(TEXTS).input_ids == [[tok.bos_token_id] + ids for ids in tr.policy.tokenizer(TEXTS).input_ids]
    assert tok.model_max_length == tr.policy.context_length
    gen = json.loads((out / "generation_config.json").read_text())
    eos = gen["eos_token_id"]
    assert sorted([eos] if isinstance(eos, int) else eos) == sorted(tr.rollouts.request.eos_ids)
    assert gen["pad_token_id"] == tr.pad_id


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_export_refuses_bad_requests_before_loading(compose, tmp_path, capsys):
    tr = _trainer(compose, tmp_path / "run")
    assert cli_main(["export", str(tr.run_dir), "--out", str(tmp_path / "x")]) == 2  # no checkpoint yet
    assert "holds no checkpoint" in capsys.readouterr().err
    _trained(tr, steps=1)
    with pytest.raises(ConfigError, match="--step 7.*steps held: 1"):
        export_run(tr.run_dir, tmp_path / "x", step=7)
    with pytest.raises(ConfigError, match="--adapter.*no LoRA"):
        export_run(tr.run_dir, tmp_path / "x", adapter=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        export_run(tr.run_dir, tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def _tiny_qwen2(folder: Path) -> str:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlcompare.models import build_char_tokenizer

    tok = build_char_tokenizer()
    ids = dict(
        vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id
    )
    config = Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **ids,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


LORA = [  # conftest's FAST minus the tiny model's keys
    "budget=tiny",
    "logger=none",
    "trainer.progress=false",
    "prompts.n_eval=16",
    "trainer.prompts_per_step=4",
    "trainer.group_size=4",
    "trainer.threads=1",
    "model=hf",
    "model.dtype=float32",
    "model.lora.enabled=true",
    "model.lora.r=4",
    "budget.max_prompt_tokens=32",
    "trainer.lr=5e-2",
    # a from-scratch model's task reward is 0: reward completions starting with a lowercase letter instead
    "verifier=format",
    "verifier.pattern='^[a-z]'",
    "+verifier.isolation=inline",
]


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_lora_export_merged_and_adapter_give_the_trainers_logits(compose, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _tiny_qwen2(tmp_path / "base")
    tr = _trainer(compose, tmp_path / "run", *LORA, f"model.name_or_path={base}", fast=False)
    before = _trained(tr, steps=3)
    want = _logits(tr.policy.model, tr.policy.tokenizer)
    assert (want - before).abs().max() > 1e-4  # the adapters moved

    merged, step = export_run(tr.run_dir, tmp_path / "merged")
    assert step == 3
    model, _ = _load(merged)
    tok = tr.policy.tokenizer
    assert not any("lora" in k for k in model.state_dict())  # plain weights, no adapter modules
    assert torch.allclose(_logits(model, tok), want, atol=1e-5)

    adapter, _ = export_run(tr.run_dir, tmp_path / "adapter", adapter=True)
    files = {p.name for p in adapter.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(plain, adapter).eval()
    assert torch.allclose(_logits(with_adapter, tok), want, atol=1e-5)


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_export_final_writes_the_last_policy_into_the_run_folder(compose, tmp_path):
    s = train(compose("trainer.export_final=true", "trainer.checkpoint_every=3", "budget.max_steps=3"))
    assert s["status"] == "completed"
    run = Path(s["run_dir"])
    final, tok = _load(run / "export")
    again, _ = _load(export_run(run, tmp_path / "from_checkpoint", step=3)[0])  # the same weights, read back
    assert torch.equal(_logits(final, tok), _logits(again, tok))


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_completed_run_with_default_settings_can_be_exported(compose, tmp_path):
    """#49: a run that ends between evals (budget=tiny: 3 steps, an eval every 5) keeps its last step, so `rlcompare
    export` works on it with default settings and gives the export_final weights; the rotation still keeps two."""
    s = train(compose("budget=tiny", "trainer.eval_every=5", "trainer.export_final=true"))
    assert s["status"] == "completed"
    run = Path(s["run_dir"])
    assert [checkpoint.step_of(p) for p in checkpoint.candidates(run)] == [3]  # no step 3 checkpoint without #49
    out = tmp_path / "exported"
    assert cli_main(["export", str(run), "--out", str(out)]) == 0
    exported, tok = _load(out)
    final, _ = _load(run / "export")  # the policy the trainer held at the end
    assert torch.equal(_logits(exported, tok), _logits(final, tok))
    # the rotation is unchanged: 7 steps, a checkpoint every 2 and the last: the newest two of 2, 4, 6, 7 remain
    s = train(compose("budget=tiny", "budget.max_steps=7", "trainer.checkpoint_every=2", "run_name=rot"))
    held = sorted(checkpoint.step_of(p) for p in checkpoint.candidates(Path(s["run_dir"])))
    assert held == [6, 7]


def test_export_refuses_a_full_out_before_loading_names_its_step_and_wraps_a_misfit(
    compose, tmp_path, capsys, monkeypatch
):
    import rlcompare.models.load as load

    tr = _trainer(compose, tmp_path / "run")
    _trained(tr, steps=1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with monkeypatch.context() as m:
        m.setattr(load, "load_policy", lambda *a, **k: pytest.fail("the model loaded before --out was checked"))
        assert cli_main(["export", str(tr.run_dir), "--out", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err
    # a run trained with rollout.engine=vllm exports without vLLM (the export samples nothing)
    cfg_file = tr.run_dir / "config.yaml"
    cfg_file.write_text(cfg_file.read_text().replace("engine: auto", "engine: vllm"))
    assert cli_main(["export", str(tr.run_dir), "--out", str(tmp_path / "a")]) == 0
    assert f"exported step 1 of {tr.run_dir} to" in capsys.readouterr().err
    # a checkpoint whose weights do not fit the model the config builds: one line naming the weight, no traceback
    path = checkpoint.candidates(tr.run_dir)[-1] / checkpoint.FILE
    blob = checkpoint.read_file(path)
    name = next(iter(blob["policy"]))
    blob["policy"][name] = torch.zeros(3, 3)
    checkpoint.write_file(blob, path)
    assert cli_main(["export", str(tr.run_dir), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"weight {name} is (3, 3)" in err and "does not fit the model" in err
