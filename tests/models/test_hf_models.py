"""`model=hf`: any causal LM from a folder (or hub id) through AutoModelForCausalLM / AutoTokenizer.

Tiny Llama, Qwen2 and GPT-2 models are built from transformers configs with a character tokenizer (a ChatML
chat template added for the chat tests) and saved with save_pretrained: no download. From scratch they solve
nothing (reward 0); the point is that the path works: loading, chat template, LoRA, reference, critic, budget.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from rlcompare.config import ConfigError, validate
from rlcompare.models import build_char_tokenizer, weights_hash
from rlcompare.rollout.sampler import _cache_kwarg, left_pad, sample, sequence_logits, token_logp
from rlcompare.train.run import train
from rlcompare.train.tracking import read_jsonl
from rlcompare.train.trainer import Trainer

CTX = 256
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DATA = Path(__file__).resolve().parents[1] / "data"
TASKS = {  # prompt set overrides, verifier
    "gsm8k": (["prompts=gsm8k", "prompts.kind=file", f"prompts.path={DATA / 'gsm8k_sample.jsonl'}"], "exact_match"),
    "math": (
        [
            "prompts=math",
            "prompts.kind=file",
            f"prompts.path={DATA / 'math_sample.jsonl'}",
            "verifier.isolation=inline",
        ],
        "math_verify",
    ),  # no worker processes in a short test
    "countdown": (["prompts=countdown", f"prompts.path={DATA / 'countdown_sample.jsonl'}"], "countdown"),
}
# A from-scratch model's reward is 0 on every task, so no gradient; to see weights move, reward a completion
# that starts with a lowercase letter (about 1 in 3 here) and sample 4 per prompt.
REWARDED = ["verifier=format", "verifier.pattern='^[a-z]'", "+verifier.isolation=inline", "trainer.group_size=4"]


def _tokenizer(chat: bool):
    tok = build_char_tokenizer()
    if chat:
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tok.chat_template = CHATML
    return tok


def _config(arch: str, tok):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    ids = dict(
        vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id
    )
    if arch == "llama":
        return LlamaConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=CTX,
            tie_word_embeddings=True,
            **ids,
        )
    if arch == "qwen2":
        return Qwen2Config(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=CTX,
            tie_word_embeddings=False,
            **ids,
        )
    # GPT-2 has dropout 0.1 by default: load_policy must turn it off
    return GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=CTX, **ids)


def _save(folder: Path, arch: str, chat: bool) -> str:
    from transformers import AutoModelForCausalLM

    tok = _tokenizer(chat)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(arch, tok))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_models")
    return {
        "llama": _save(root / "llama", "llama", chat=True),
        "qwen2": _save(root / "qwen2", "qwen2", chat=True),
        "gpt2": _save(root / "gpt2", "gpt2", chat=False),
    }


def _overrides(path: str, task: str = "gsm8k", *extra: str) -> list[str]:
    prompts, verifier = TASKS[task]
    return [
        "logger=none",
        "trainer.progress=false",
        "trainer.threads=1",  # conftest's FAST minus the tiny model's keys
        "trainer.unhealthy=warn",  # 2 untrained steps: every group's rewards may be equal (docs/metrics.md, "Run health")
        "model=hf",
        f"model.name_or_path={path}",
        *prompts,
        "prompts.template=plain",
        f"verifier={verifier}",
        "budget=tiny",
        "budget.max_prompt_tokens=200",
        "budget.max_new_tokens=8",
        "budget.max_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.group_size=2",
        "prompts.n_eval=2",
        "trainer.eval_every=2",
        "trainer.updates_per_rollout=1",
        "trainer.lr=1e-2",
        *extra,
    ]


def _trainer(compose, tmp_path, *overrides) -> Trainer:
    return Trainer(validate(compose(*overrides, fast=False)), tmp_path / "run")


def _fresh_base(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _weights(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    "arch,task,extra",
    [
        ("llama", "gsm8k", ["prompts.chat=true"]),
        ("qwen2", "math", ["model.lora.enabled=true", "algorithm=dapo"]),
        ("llama", "countdown", ["model.lora.enabled=true", "prompts.chat=true", "prompts.system_prompt=be brief"]),
        ("gpt2", "countdown", ["algorithm=ppo"]),  # another architecture through the same path
    ],
)
@pytest.mark.slow
def test_hf_model_trains_end_to_end(compose, models, arch, task, extra):
    s = train(compose(*_overrides(models[arch], task, *extra), f"run_name={arch}_{task}", fast=False))
    assert s["status"] == "completed" and s["steps"] == 2
    run = Path(s["run_dir"])
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["tokens/generated"] > 0
    assert all(r["reward/mean"] is not None for r in rows)
    assert [e["step"] for e in read_jsonl(run / "eval.jsonl")] == [0, 2]
    fp = json.loads((run / "fingerprint.json").read_text())
    # the base weights' hash, with or without LoRA
    assert fp["init_weights_hash"] == weights_hash(_fresh_base(models[arch])) and fp["model"] == models[arch]


# ----------------------------------------------------------------------------- LoRA
def test_lora_trains_only_adapters_and_the_reference_is_the_base(compose, models, tmp_path):
    path = models["qwen2"]
    tr = _trainer(
        compose,
        tmp_path,
        *_overrides(path, "gsm8k", "model.lora.enabled=true", "model.lora.r=4", "algorithm.kl.coef=0.1", *REWARDED),
    )
    model = tr.policy.model
    assert tr.policy.lora and tr.ref is not None and tr.ref.model is None  # no second copy
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {id(p) for p in tr.params} == {id(p) for n, p in model.named_parameters() if "lora_" in n}
    base_before = {k: v for k, v in _weights(model).items() if "lora_" not in k}
    lora_before = {k: v for k, v in _weights(model).items() if "lora_" in k}
    rows = [tr.step() for _ in range(2)]
    assert all(r["kl/ref"] is not None for r in rows)
    after = _weights(model)
    assert all(torch.equal(after[k], v) for k, v in base_before.items())  # base weights untouched
    assert any(not torch.equal(after[k], v) for k, v in lora_before.items())  # adapters moved
    assert tr.policy.init_hash == weights_hash(_fresh_base(path))

    # the reference (adapters disabled) is exactly the base model; the policy has moved away from it
    pi, pm = left_pad([p.ids for p in tr.train_prompts[:3]], tr.pad_id, "cpu")
    comp = sample(model.eval(), pi, pm, max_new_tokens=6, eos_id=tr.policy.eos_ids(), pad_id=tr.pad_id)
    with torch.no_grad():
        lp = lambda m: token_logp(sequence_logits(m, pi, pm, comp.ids, comp.mask), comp.ids) * comp.mask
        ref_lp, pol_lp, base_lp = tr.ref(lp), lp(model), lp(_fresh_base(path))
    assert torch.allclose(ref_lp, base_lp, atol=1e-5)
    assert (pol_lp - base_lp).abs().max() > 1e-3
    assert model.training is False  # the reference left the mode as it was


def test_sampling_with_lora_uses_the_kv_cache_without_deprecated_arguments(compose, models, tmp_path):
    tr = _trainer(compose, tmp_path, *_overrides(models["llama"], "gsm8k", "model.lora.enabled=true"))
    model = tr.policy.model
    base = model.get_base_model()
    assert _cache_kwarg(model) == _cache_kwarg(base)
    lengths = []
    hook = base.register_forward_pre_hook(
        lambda mod, args, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    pi, pm = left_pad([p.ids for p in tr.train_prompts[:2]], tr.pad_id, "cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")  # "`past_key_values` is deprecated ..."
        comp = sample(
            model.eval(),
            pi,
            pm,
            max_new_tokens=5,
            eos_id=tr.policy.eos_ids(),
            pad_id=tr.pad_id,
            greedy=True,
            kv_cache="dynamic",
        )  # transformers' cache through the peft wrapper
    hook.remove()
    assert lengths[0] == pi.shape[1] and set(lengths[1:]) == {1}  # one token per step: the cache is used
    with torch.no_grad():
        full = token_logp(sequence_logits(model, pi, pm, comp.ids, comp.mask), comp.ids) * comp.mask
    assert torch.allclose(full, comp.logp, atol=1e-4)  # cached decoding == a full forward


# ----------------------------------------------------------------------------- reference, critic
def test_kl_coef_zero_loads_no_reference(compose, models, tmp_path):
    tr = _trainer(compose, tmp_path, *_overrides(models["llama"], "gsm8k", "algorithm.kl.coef=0"))
    assert tr.ref is None
    tr = _trainer(compose, tmp_path, *_overrides(models["llama"], "gsm8k", "algorithm.kl.coef=0.05"))
    assert tr.ref is not None and tr.ref.model is not None and tr.ref.model is not tr.policy.model
    assert not any(p.requires_grad for p in tr.ref.model.parameters())


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_ppo_critic_starts_from_the_policy_weights_and_both_train(compose, models, tmp_path, lora):
    tr = _trainer(
        compose,
        tmp_path,
        *_overrides(
            models["llama"],
            "gsm8k",
            "algorithm=ppo",
            f"model.lora.enabled={lora}",
            "algorithm.critic.lr=1e-2",
            *REWARDED,
        ),
    )
    body = tr.policy.model.get_base_model().model if lora else tr.policy.model.model
    critic_body = tr.critic.body.state_dict()
    assert critic_body.keys() == body.state_dict().keys()
    assert all(torch.equal(critic_body[k], v) for k, v in body.state_dict().items())
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(tr.critic.body.parameters(), body.parameters()))  # a copy
    critic_trainable = [n for n, p in tr.critic.named_parameters() if p.requires_grad]
    if lora:  # the critic trains its own adapters and the head, like the policy
        assert all("lora_" in n or n.startswith("head.") for n in critic_trainable)
    else:
        assert len(critic_trainable) == len(list(tr.critic.parameters()))
    pol0, crit0 = _weights(tr.policy.model), _weights(tr.critic)
    for _ in range(2):
        row = tr.step()
    assert row["loss/value"] is not None
    pol1, crit1 = _weights(tr.policy.model), _weights(tr.critic)
    assert any(not torch.equal(pol1[k], v) for k, v in pol0.items())
    assert any(not torch.equal(crit1[k], v) for k, v in crit0.items() if k.startswith("body."))
    assert not torch.equal(crit1["head.weight"], crit0["head.weight"])


# ----------------------------------------------------------------------------- chat template, context
def test_chat_template_is_applied(compose, models, tmp_path):
    tr = _trainer(
        compose, tmp_path, *_overrides(models["llama"], "gsm8k", "prompts.chat=true", "prompts.system_prompt=sys")
    )
    tok = tr.policy.tokenizer
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda text: tok(text, add_special_tokens=False).input_ids
    for p in tr.train_prompts + tr.eval_prompts:
        assert p.ids[0] == start and p.ids.count(start) == 3 and p.ids.count(end) == 2
        assert p.ids == (
            enc("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\n")
            + enc(p.example.prompt)
            + enc("<|im_end|>\n<|im_start|>assistant\n")
        )
    plain = _trainer(compose, tmp_path, *_overrides(models["llama"], "gsm8k"))
    assert all(start not in p.ids and p.ids[0] == tok.bos_token_id for p in plain.train_prompts)


def test_chat_without_a_chat_template_is_a_clear_error(compose, models, tmp_path):
    with pytest.raises(ConfigError, match="prompts.chat=true but the tokenizer has no chat template"):
        _trainer(compose, tmp_path, *_overrides(models["gpt2"], "gsm8k", "prompts.chat=true"))


def test_budget_beyond_the_model_context_is_a_clear_error(compose, models, tmp_path):
    for arch, lora in (("llama", False), ("qwen2", True), ("gpt2", False)):  # GPT-2: n_positions
        with pytest.raises(ConfigError, match=rf"= {CTX + 8} exceeds the model's context \({CTX} positions\)"):
            _trainer(
                compose,
                tmp_path,
                *_overrides(models[arch], "gsm8k", f"budget.max_prompt_tokens={CTX}", f"model.lora.enabled={lora}"),
            )


def test_missing_model_folder_is_a_clear_error(compose, tmp_path):
    with pytest.raises(ConfigError, match="is not a folder"):
        _trainer(compose, tmp_path, *_overrides(str(tmp_path / "nope"), "gsm8k"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="without config.json"):
        _trainer(compose, tmp_path, *_overrides(str(tmp_path / "empty"), "gsm8k"))


# ----------------------------------------------------------------------------- dtype, attention, checkpointing
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_dtype_attention_and_dropout_settings(compose, models, tmp_path):
    tr = _trainer(
        compose,
        tmp_path,
        *_overrides(models["qwen2"], "gsm8k", "model.dtype=bfloat16", "model.attn_implementation=eager"),
    )
    m = tr.policy.model
    assert next(m.parameters()).dtype == torch.bfloat16 and m.config._attn_implementation == "eager"
    tr.step()
    tr = _trainer(
        compose,
        tmp_path,
        *_overrides(models["qwen2"], "gsm8k", "model.dtype=bfloat16", "model.lora.enabled=true", *REWARDED),
    )
    lora = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters() if p.requires_grad}
    assert lora and all(p.dtype == torch.float32 for p in lora.values())  # bf16 base, fp32 adapters
    tr.step()
    assert any(not torch.equal(p, lora[n]) for n, p in tr.policy.model.named_parameters() if n in lora)
    gpt2 = _trainer(
        compose, tmp_path, *_overrides(models["gpt2"], "gsm8k", "model.dtype=float32", "model.attn_implementation=sdpa")
    )
    m = gpt2.policy.model
    assert next(m.parameters()).dtype == torch.float32 and m.config._attn_implementation == "sdpa"
    assert all(mod.p == 0 for mod in m.modules() if isinstance(mod, torch.nn.Dropout))  # GPT-2's 0.1 turned off
    assert m.config.resid_pdrop == 0 and m.config.attn_pdrop == 0


@pytest.mark.parametrize("lora,algorithm", [(False, "grpo"), (True, "ppo")])
def test_gradient_checkpointing_keeps_the_sampling_cache_and_trains(compose, models, tmp_path, lora, algorithm):
    tr = _trainer(
        compose,
        tmp_path,
        *_overrides(
            models["llama"],
            "gsm8k",
            "model.gradient_checkpointing=true",
            f"model.lora.enabled={lora}",
            f"algorithm={algorithm}",
            *REWARDED,
        ),
    )
    model = tr.policy.model
    base = model.get_base_model() if lora else model
    assert base.model.gradient_checkpointing and base.config.use_cache
    lengths = []
    hook = base.register_forward_pre_hook(
        lambda mod, args, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    pi, pm = left_pad([p.ids for p in tr.train_prompts[:2]], tr.pad_id, "cpu")
    comp = sample(
        model.eval(),
        pi,
        pm,
        max_new_tokens=5,
        eos_id=tr.policy.eos_ids(),
        pad_id=tr.pad_id,
        greedy=True,
        kv_cache="dynamic",
    )
    hook.remove()
    assert lengths[0] == pi.shape[1] and set(lengths[1:]) == {1}
    with torch.no_grad():
        full = token_logp(sequence_logits(model, pi, pm, comp.ids, comp.mask), comp.ids) * comp.mask
    assert torch.allclose(full, comp.logp, atol=1e-4)
    static = sample(
        model, pi, pm, max_new_tokens=5, eos_id=tr.policy.eos_ids(), pad_id=tr.pad_id, greedy=True
    )  # own cache
    assert torch.equal(static.ids, comp.ids) and torch.allclose(static.logp, comp.logp, atol=1e-4)
    # in training the layers run again in the backward pass (that is the checkpointing)
    calls = []
    hook = base.model.layers[0].self_attn.register_forward_hook(lambda *a: calls.append(torch.is_grad_enabled()))
    model.train()
    sequence_logits(model, pi, pm, comp.ids, comp.mask).float().logsumexp(-1).sum().backward()
    hook.remove()
    assert len(calls) == 2
    model.zero_grad(set_to_none=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    tr.step()
    after = dict(model.named_parameters())
    assert any(not torch.equal(after[n], v) for n, v in before.items())  # gradients flowed through checkpointed layers


def test_several_eos_ids_from_the_generation_config(compose, models, tmp_path):
    from transformers import GenerationConfig

    folder = tmp_path / "multi_eos"
    path = _save(folder, "llama", chat=True)
    gen = GenerationConfig.from_pretrained(folder)
    tok = _tokenizer(True)
    gen.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    gen.save_pretrained(folder)
    tr = _trainer(compose, tmp_path, *_overrides(path, "gsm8k", "prompts.chat=true"))
    assert sorted(tr.rollouts.request.eos_ids) == sorted(gen.eos_token_id)
    row = tr.step()
    assert row["tokens/step"] > 0


def test_lora_target_modules_that_match_nothing_is_a_clear_error(compose, models, tmp_path):
    with pytest.raises(ConfigError, match="model.lora.target_modules"):
        _trainer(
            compose,
            tmp_path,
            *_overrides(
                models["llama"], "gsm8k", "model.lora.enabled=true", "model.lora.target_modules=[no_such_proj]"
            ),
        )


# Other architectures, built from their transformers configs: the sampler's log-probs (KV cache, prompt
# prefilled once per group, rows dropped as they end) must equal those of one full forward per sequence, left
# padding and all, for rotary, ALiBi, learned-position and sliding-window models alike.
OTHER_ARCHES = {
    "gpt_neox": {},
    "opt": {},
    "bloom": {},
    "phi3": {},
    "mixtral": {"num_local_experts": 2, "num_experts_per_tok": 1},
    "gemma2": {"head_dim": 8, "sliding_window": 4},  # window shorter than prompt + completion
}


def _save_arch(folder: Path, arch: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = _tokenizer(chat=False)
    cfg = AutoConfig.for_model(
        arch,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=CTX,
        **OTHER_ARCHES.get(arch, {}),
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("arch", sorted(OTHER_ARCHES))
def test_other_architectures_sample_and_score_the_same_log_probs(tmp_path, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _save_arch(tmp_path / arch, arch)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    seqs = [[tok.bos_token_id] + [10 + i, 11, 12] * (1 + i % 3) for i in range(3)]  # 4, 7, 10 tokens: left padding
    pi, pm = left_pad(seqs, tok.pad_token_id, "cpu")
    comp = sample(
        model,
        pi,
        pm,
        max_new_tokens=8,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        repeats=3,
        generator=torch.Generator().manual_seed(0),
    )
    rows = comp.mask.bool()
    assert rows.sum() > 20
    with torch.no_grad():
        for i in range(comp.ids.shape[0]):  # each sequence alone, no padding, no cache
            p, n = seqs[i // 3], int(comp.lengths[i])
            logits = model(input_ids=torch.tensor([p + comp.ids[i, :n].tolist()])).logits[
                0, len(p) - 1 : len(p) - 1 + n
            ]
            torch.testing.assert_close(token_logp(logits, comp.ids[i, :n]), comp.logp[i, :n], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["mamba", "rwkv"])
def test_a_model_without_an_attention_kv_cache_is_a_clear_error(compose, tmp_path, arch):
    path = _save_arch(tmp_path / arch, arch)
    with pytest.raises(ConfigError, match=r"model.name_or_path=.*cannot be sampled by rlcompare.*attention model"):
        _trainer(compose, tmp_path, *_overrides(path))
