"""Policy, tokenizer, reference and critic: built from a config (tiny) or loaded (any HF causal LM)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlcompare.fast import base_model_of  # moved to fast/unwrap.py (the sampler needs it below models/)
from rlcompare.config import PICKLE_SUFFIXES  # weight files that unpickle on load: never loaded
from rlcompare.data.char_tokenizer import CHARS, SPECIAL, build_char_tokenizer  # noqa: F401 - re-exported (rlcompare.models)


def tiny_model_config(mcfg: Any, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=mcfg.hidden_size,
        num_hidden_layers=mcfg.num_layers,
        num_attention_heads=mcfg.num_heads,
        num_key_value_heads=mcfg.num_heads,
        intermediate_size=mcfg.intermediate_size,
        max_position_embeddings=mcfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        attention_dropout=0.0,
    )


def weights_hash(model: nn.Module) -> str:
    """sha256 over parameter names and bytes: two runs start from the same weights iff equal."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def cache_root(mcfg: Any) -> Path:
    root = (
        mcfg.cache_dir
        or os.environ.get("RLCOMPARE_CACHE")
        or os.path.join(os.path.expanduser("~"), ".cache", "rlcompare")
    )
    return Path(root)


# Version of the warm-start recipe: bump it when warm_start_tiny's training changes, so cached and shipped
# weights made by the old recipe stop matching. 4: keyed by the table it trains on; shipped weights.
WARM_START_VERSION = 4
# Warm starts made once (scripts/make_warm_start.py) and shipped with the package, one folder per key: the
# embedded default starts from the same weights on every machine (a warm start computed locally differs
# between CPU types: float rounding compounds over its 300 steps).
SHIPPED_WARM_STARTS = Path(__file__).resolve().parent / "warmstart"
SHIPPED_WEIGHTS = "model.safetensors"
SHIPPED_MANIFEST = "manifest.json"


def warm_start_table(splits, prompts_cfg: Any = None) -> list[tuple[str, str]]:
    """The (prompt, answer) pairs the warm start trains on: the whole task table, eval prompts included; for the
    lab task (`prompts.kind=chain`, whose lists are too many to memorize) the train split only, so its held-out
    lists are never seen before evaluation."""
    if _kind(prompts_cfg) == "chain":  # repeats kept: two-term sums (few distinct lists) keep their share
        return sorted((ex.prompt, ex.answer) for ex in splits.train)
    # a structured reference (reasoning_gym's JSON) trains on the answer text a completion states
    return sorted({(ex.prompt, ex.meta.get("answer_text") or ex.answer) for ex in splits.train + splits.eval})


def _kind(prompts_cfg: Any) -> str | None:
    return None if prompts_cfg is None else prompts_cfg.get("kind")


def warm_start_recipe(mcfg: Any, prompts_cfg: Any = None) -> dict:
    """model.warm_start, with the keys a prompt set's own `prompts.warm_start` replaces (the lab task's)."""
    from omegaconf import OmegaConf

    recipe = OmegaConf.to_container(mcfg.warm_start, resolve=True)
    own = None if prompts_cfg is None else prompts_cfg.get("warm_start")
    if own is not None:
        recipe.update(OmegaConf.to_container(own, resolve=True) if OmegaConf.is_config(own) else dict(own))
    return recipe


def _warm_start_key(mcfg: Any, table: list[tuple[str, str]], prompts_cfg: Any = None) -> str:
    """Hash of everything the warm start depends on: model shape, recipe, the table itself, the tokenizer."""
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(mcfg, resolve=True)
    spec = {
        "model": {
            k: model[k]
            for k in (
                "hidden_size",
                "num_layers",
                "num_heads",
                "intermediate_size",
                "max_position_embeddings",
                "warm_start",
            )
        },
        "table": hashlib.sha256(json.dumps(table).encode()).hexdigest(),
        "chars": "".join(CHARS),
        "special": SPECIAL,
        "version": WARM_START_VERSION,
    }
    if _kind(prompts_cfg) == "chain":  # only here: the default's key (and so its shipped weights) stays as it was
        spec["task"] = {"kind": "chain", "recipe": warm_start_recipe(mcfg, prompts_cfg)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _target_fn(recipe: dict, prompts_cfg: Any):
    """(prompt, answer, rng) -> the completion the warm start trains on."""
    if _kind(prompts_cfg) == "chain":
        from rlcompare.data.chain_task import sft_target, terms_of

        if "forms" not in recipe:  # a chain-kind set of one's own without the lab's warm-start block
            raise _config_error(
                "prompts.kind=chain on model=tiny needs prompts.warm_start.forms (how the warm start writes its "
                "targets), e.g. +prompts.warm_start.forms='{answer: 0.4, sums: 0.3, steps: 0.3}' as prompts=chain has"
            )
        forms, frac, offsets = recipe["forms"], recipe["noisy_label_frac"], tuple(recipe["noise_offsets"])
        return lambda prompt, answer, rng: sft_target(terms_of(prompt), rng, forms, frac, offsets)
    return lambda prompt, answer, rng: noisy_label(answer, recipe["noisy_label_frac"], rng, recipe["noise_offsets"])


def noisy_label(answer: str, frac: float, rng: random.Random, offsets=(1, 2)) -> str:
    """The warm start's label: with probability `frac`, off by one of `offsets` (resampled every time)."""
    if rng.random() >= frac or not answer.lstrip("-").isdigit():
        return answer
    return str(int(answer) + rng.choice(tuple(offsets)))


class WarmStart:
    """Where the tiny policy's starting weights are and how they were made.

    origin: "shipped" (made once and shipped with rlcompare: the same on every machine), "cached" (computed on
    this machine by an earlier run) or "computed" (computed by this run)."""

    def __init__(self, folder: str, key: str, origin: str):
        self.folder, self.key, self.origin = folder, key, origin


def warm_start_tiny(
    mcfg: Any, prompts_cfg: Any, splits, log=print, device: str = "cpu", use_shipped: bool = True
) -> WarmStart:
    """The tiny policy's warm start: the shipped one for this key, else a supervised warm start cached by its key.

    A from-scratch model solves nothing, so RL has no signal; half the labels off by one or two, and few steps,
    give a policy that is right about a fifth of the time (greedy) and can improve. Shipped weights come first,
    so a warm start computed here earlier for the same key is not used.
    """
    table = warm_start_table(splits, prompts_cfg)
    key = _warm_start_key(mcfg, table, prompts_cfg)
    root = cache_root(mcfg) / "warmstart"
    shipped = SHIPPED_WARM_STARTS / key if use_shipped else None
    if shipped is not None and shipped.is_dir():
        model, init_hash = load_shipped_warm_start(shipped, mcfg)
        folder = root / f"{key}.shipped-{init_hash}"  # the shipped tensors as a save_pretrained folder
        if not (folder / "config.json").exists():
            _save_atomically(model, build_char_tokenizer(), folder)
        log(f"[rlcompare] warm start: shipped with rlcompare ({key}, weights {init_hash}): the same on every machine")
        return WarmStart(str(folder), key, "shipped")
    folder = root / key
    if (folder / "config.json").exists():
        log(
            f"[rlcompare] warm start: computed on this machine earlier (no shipped weights for this config; cached as {key})"
        )
        return WarmStart(str(folder), key, "cached")
    recipe = warm_start_recipe(mcfg, prompts_cfg)
    log(
        f"[rlcompare] warm start: {recipe['steps']} supervised steps on {len(table)} prompts, computed on this "
        f"machine (no shipped weights for this config); progress every {WARM_START_PROGRESS_S:.0f} s"
    )
    t0 = time.monotonic()
    model = _train_warm_start(mcfg, table, device, recipe, _target_fn(recipe, prompts_cfg), log=log)
    _save_atomically(model.to("cpu"), build_char_tokenizer(), folder)
    log(f"[rlcompare] warm start: done in {time.monotonic() - t0:.0f} s, cached as {key} for later runs ({folder})")
    return WarmStart(str(folder), key, "computed")


WARM_START_PROGRESS_S = 30.0  # seconds between the warm start's progress lines (a long one showed nothing for minutes)


def _train_warm_start(
    mcfg: Any, table: list[tuple[str, str]], device: str, recipe: dict, target, log=print
) -> nn.Module:
    """Supervised steps on the table with noisy labels (loss on the completion only); `target(prompt, answer, rng)`
    writes each completion (the answer, off by one or two with probability noisy_label_frac, for the default).
    A progress line every WARM_START_PROGRESS_S seconds (it reads the clock only: the steps are as without it)."""
    from transformers import LlamaForCausalLM

    tok = build_char_tokenizer()
    torch.manual_seed(recipe["seed"])
    rng = random.Random(recipe["seed"])
    model = LlamaForCausalLM(tiny_model_config(mcfg, tok)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
    steps = recipe["steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps))
    # The warm start covers the whole task table (eval prompts included) with noisy labels, so the
    # policy knows the format and roughly the answer everywhere; RL then trains on the train prompts
    # only, and the eval prompts measure how far the RL gain transfers. Trained on the train pairs
    # alone, a 0.5M-parameter model memorizes them and RL moves held-out accuracy by noise only.
    model.train()
    t0 = last = time.monotonic()
    for step in range(steps):
        batch = [table[rng.randrange(len(table))] for _ in range(recipe["batch_size"])]
        texts, plens = [], []
        for prompt, ans in batch:
            texts.append(tok.bos_token + prompt + target(prompt, ans, rng) + tok.eos_token)
            plens.append(len(tok(tok.bos_token + prompt, add_special_tokens=False).input_ids))
        enc = tok(texts, add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt")
        labels = enc.input_ids.clone()
        labels[enc.attention_mask == 0] = -100
        for i, p in enumerate(plens):
            labels[i, :p] = -100  # loss on the answer only
        loss = model(
            input_ids=enc.input_ids.to(device), attention_mask=enc.attention_mask.to(device), labels=labels.to(device)
        ).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if time.monotonic() - last >= WARM_START_PROGRESS_S:
            last = time.monotonic()
            log(f"[rlcompare] warm start: step {step + 1}/{steps} (loss {loss.item():.3f}, {last - t0:.0f} s)")
    return model


def _save_atomically(model: nn.Module, tokenizer, folder: Path) -> None:
    """save_pretrained into a temporary sibling, then rename: a reader never sees a half-written folder."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    if not (tmp / "config.json").exists():  # never publish a folder without the model (it would poison the cache)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(
            f"save_pretrained wrote no model into {tmp}: transformers saves only on rank 0 of an "
            f"initialised torch.distributed group; the warm start must be built by rank 0 first"
        )
    tokenizer.save_pretrained(tmp)
    os.makedirs(folder.parent, exist_ok=True)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _shipped_error(folder: Path, problem: str) -> RuntimeError:
    return RuntimeError(
        f"shipped warm start {folder}: {problem}; reinstall rlcompare, or regenerate it with "
        f"`python scripts/make_warm_start.py` in a source checkout"
    )


def load_shipped_warm_start(folder: Path, mcfg: Any) -> tuple[nn.Module, str]:
    """The tiny Llama (architecture built in code from `mcfg`) with the tensors of a shipped folder.

    Safetensors only: a folder holding a pickle weight file is refused, never opened. The tensors must fill
    the model exactly (names and shapes) and hash to the manifest's `init_weights_hash`.
    """
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    pickles = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise _shipped_error(
            folder,
            f"holds pickle weight files {pickles}, which rlcompare never loads "
            f"(unpickling can run code); only {SHIPPED_WEIGHTS} is read",
        )
    weights, manifest_path = folder / SHIPPED_WEIGHTS, folder / SHIPPED_MANIFEST
    if not weights.is_file() or not manifest_path.is_file():
        raise _shipped_error(folder, f"{SHIPPED_WEIGHTS} or {SHIPPED_MANIFEST} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
        expected = str(manifest["init_weights_hash"])
    except (ValueError, KeyError, TypeError) as e:
        raise _shipped_error(folder, f"{SHIPPED_MANIFEST} does not parse or has no init_weights_hash ({e})") from None
    model = LlamaForCausalLM(tiny_model_config(mcfg, build_char_tokenizer()))
    try:
        missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    except (RuntimeError, OSError, ValueError) as e:  # shapes that do not fit, or not a safetensors file
        raise _shipped_error(folder, f"{SHIPPED_WEIGHTS} does not fit the tiny model ({e})") from None
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()  # save_pretrained drops the tied copy
    if unexpected or set(missing) - tied:
        raise _shipped_error(
            folder,
            f"{SHIPPED_WEIGHTS} does not fit the tiny model (missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)})",
        )
    model.tie_weights()
    got = weights_hash(model)
    if got != expected:
        raise _shipped_error(folder, f"its tensors hash to {got}, its manifest says {expected} (a damaged file)")
    return model, got


# ----------------------------------------------------------------------------- loading
class Policy:
    """What the trainer needs of a language model: the module, its tokenizer and how it was made."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        init_hash: str,
        source: str,
        warm_start_key: str | None,
        lora: bool,
        warm_start_origin: str | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.init_hash = init_hash
        self.source = source
        self.warm_start_key = warm_start_key
        self.warm_start_origin = warm_start_origin  # tiny: shipped | cached | computed (WarmStart.origin)
        self.lora = lora

    @property
    def context_length(self) -> int | None:
        cfg = getattr(self.model, "config", None)
        if cfg is None or not hasattr(cfg, "to_dict"):
            return getattr(cfg, "max_position_embeddings", None)
        from rlcompare.config import context_from  # the keys preflight reads from config.json, read once

        return context_from(cfg.to_dict())

    def eos_ids(self) -> list[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen = getattr(self.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None) if gen is not None else None
        if isinstance(extra, int):
            ids.add(extra)
        elif extra:
            ids.update(int(i) for i in extra)
        if not ids:
            raise ValueError(
                "the tokenizer has no eos_token: completions could never stop; set one in the tokenizer config"
            )
        return sorted(ids)


def _torch_dtype(name: str, device: str):
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if name == "float16":
        return torch.float16
    # auto: bf16 on a GPU that supports it, fp32 on the CPU
    if device == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def _config_error(msg: str) -> Exception:
    from rlcompare.config import ConfigError  # a one-line error at the CLI

    return ConfigError(msg)


def _check_source(path: str) -> None:
    """Fail fast (before any hub request) on a local path that cannot hold a model."""
    looks_local = os.path.isabs(path) or path.startswith(("./", "../", "~")) or os.path.exists(path)
    full = os.path.expanduser(path)
    if looks_local and not os.path.isdir(full):
        raise _config_error(
            f"model.name_or_path={path!r} is not a folder; give a local folder holding config.json "
            f"(save_pretrained output) or a hub id such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    if os.path.isdir(full) and not os.path.exists(os.path.join(full, "config.json")):
        from rlcompare.config.model_source import no_config_hint

        raise _config_error(
            f"model.name_or_path={path!r} is a folder without config.json; point it at the folder "
            f"written by save_pretrained (model and tokenizer files){no_config_hint(full)}"
        )


def _model_config(path: str, m: Any, gguf: dict | None = None):
    """The model's config with every dropout probability at 0 (when model.disable_dropout): RL compares
    log-probs of the same tokens under sampling and update, so dropout would only add noise to the ratios.
    `gguf`: {"gguf_file": name} for a GGUF file (its metadata is the config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=m.trust_remote_code, **(gguf or {}))
    if getattr(m, "disable_dropout", True):
        for key, value in config.to_dict().items():
            if ("dropout" in key or "pdrop" in key) and isinstance(value, float) and value > 0:
                setattr(config, key, 0.0)
    return config


def disable_dropout(model: nn.Module) -> None:
    for mod in model.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0


def enable_gradient_checkpointing(model) -> None:
    """Recompute each layer's activations in the backward pass (training only).

    Non-reentrant checkpointing, so gradients reach LoRA adapters behind frozen embeddings. It is active only
    when the module is in train mode with gradients on: our sampler calls the model in eval mode under
    inference_mode with a KV cache, which checkpointing leaves alone.
    """
    kwargs = {"use_reentrant": False}
    try:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    except ValueError as e:
        raise _config_error(
            f"model.gradient_checkpointing=true but {type(model).__name__} does not support it ({e}); "
            f"set model.gradient_checkpointing=false"
        ) from None
    model.config.use_cache = True  # the sampler still uses the KV cache


_LORA_CLASS = None


def _lora_model_class():
    """`PeftModelForCausalLM` whose forward names the KV-cache argument the way the wrapped model does.

    The sampler picks the cache keyword (`cache` in transformers 5, `past_key_values` before) by inspecting
    `type(model).forward`; peft's forward takes `**kwargs`, so it would fall back to the deprecated
    `past_key_values`. This subclass declares `cache` and hands it on under the base model's own name.
    """
    global _LORA_CLASS
    if _LORA_CLASS is None:
        import inspect

        from peft import PeftModelForCausalLM

        class LoraCausalLM(PeftModelForCausalLM):
            def forward(self, input_ids=None, attention_mask=None, cache=None, **kwargs):
                if cache is not None:
                    base = self.get_base_model()
                    name = "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
                    kwargs[name] = cache
                return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

        _LORA_CLASS = LoraCausalLM
    return _LORA_CLASS


def apply_lora(model, lcfg: Any):
    """Wrap `model` with fresh LoRA adapters (peft); only the adapters stay trainable."""
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    tm = lcfg.target_modules
    tm = tm if isinstance(tm, str) else list(tm)
    try:
        with warnings.catch_warnings():  # peft asks transformers 5 for a deprecated flag name
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(
                model,
                PeftLoraConfig(
                    r=lcfg.r, lora_alpha=lcfg.alpha, lora_dropout=lcfg.dropout, target_modules=tm, task_type="CAUSAL_LM"
                ),
            )
    except ValueError as e:
        raise _config_error(f"model.lora.target_modules={tm!r} does not fit {type(model).__name__}: {e}") from None
    cls = _lora_model_class()
    if type(peft_model).__name__ == "PeftModelForCausalLM":
        peft_model.__class__ = cls
    return peft_model


def load_policy(cfg: Any, splits, device: str, log=print) -> Policy:
    """Build/load the policy named by `cfg.model` (same code path for a hub id and a local folder).

    hf: `AutoTokenizer` / `AutoModelForCausalLM` with model.dtype and model.attn_implementation; dropout off
    (model.disable_dropout); model.gradient_checkpointing; LoRA adapters through peft when model.lora.enabled.
    `init_hash` is the hash of the loaded base weights (before any adapter).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = cfg.model
    warm, gguf = None, {}
    if m.kind == "tiny":
        warm = warm_start_tiny(m, cfg.prompts, splits, log=log, device=device)
        path = warm.folder
        dtype = torch.float32
        attn = None
    else:
        path, gguf = _hf_source(m)
        dtype = _torch_dtype(m.dtype, device)
        attn = m.attn_implementation
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=m.trust_remote_code, **gguf)
        kwargs = {"dtype": dtype, "trust_remote_code": m.trust_remote_code, "config": _model_config(path, m, gguf)}
        if warm is not None:
            kwargs["use_safetensors"] = True  # warm starts are written as safetensors: never unpickle a cache file
        if attn:
            kwargs["attn_implementation"] = attn
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs, **gguf)
    except OSError as e:
        if warm is not None:  # a damaged cache folder, or one without model.safetensors (pickles are not read)
            raise RuntimeError(
                f"the warm start in {path} could not be loaded ({e}); delete that folder and rerun to recompute it"
            ) from None
        raise _config_error(
            f"model.name_or_path={path!r} could not be loaded (not a local folder with config.json, "
            f"and not reachable on the hub): {e}"
        ) from None
    if getattr(m, "disable_dropout", True):
        disable_dropout(model)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise _config_error(
                f"the tokenizer of {path!r} has neither a pad nor an eos token; set one in its tokenizer config"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    init_hash = weights_hash(model)
    model.to(device)
    lora = bool(m.kind == "hf" and m.lora.enabled)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if lora:
        model = apply_lora(model, m.lora)
    if m.kind == "hf":
        from rlcompare.rollout import check_sampling_support

        try:
            check_sampling_support(
                model, tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
            )
        except ValueError as e:
            raise _config_error(f"model.name_or_path={path!r}: {e}") from None
    if not lora and m.kind == "hf" and dtype in (torch.bfloat16, torch.float16):
        log(
            f"[rlcompare] note: full fine-tuning with {str(dtype).removeprefix('torch.')} weights: AdamW updates smaller "
            f"than the weights' resolution (about |w|/256) are rounded away, so a small trainer.lr may barely move "
            f"the model; model.dtype=float32 keeps fp32 weights (bf16 autocast on a GPU), or use model.lora.enabled=true"
        )
    return Policy(
        model,
        tokenizer,
        init_hash=init_hash,
        source=_source_label(m, path),
        lora=lora,
        warm_start_key=warm.key if warm else None,
        warm_start_origin=warm.origin if warm else None,
    )


def _hf_source(m: Any) -> tuple[str, dict]:
    """(the folder or hub id to load, {"gguf_file": name} for a GGUF file else {}), checked before loading."""
    from rlcompare.config.model_source import check_gguf, gguf_file_of, model_folder

    gguf = {"gguf_file": gguf_file_of(m)} if gguf_file_of(m) else {}  # weights dequantised to float32
    if gguf:
        check_gguf(m)
    else:
        _check_source(str(m.name_or_path))
    return model_folder(m), gguf


def _source_label(m: Any, path: str) -> str:
    """The policy's source as the fingerprint names it: the folder loaded, or (GGUF) the name as given and the file
    (a package's folder differs between machines)."""
    if m.kind == "hf" and m.get("gguf_file"):
        from rlcompare.config.model_source import source_label

        return source_label(m)
    return str(path)


class ReferenceModel:
    """Frozen reference for KL. With LoRA it is the base with adapters disabled, not a second copy
    (`self.model is None`); otherwise a frozen deep copy of the initial policy."""

    def __init__(self, policy: Policy):
        self.policy = policy
        if policy.lora:
            self.model = None
        else:
            self.model = copy.deepcopy(policy.model).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)

    def __call__(self, fn):
        """Run fn(model) under the reference weights."""
        if self.model is not None:
            return fn(self.model)
        model = self.policy.model
        was_training = model.training
        model.eval()  # no adapter dropout in the reference
        try:
            with model.disable_adapter():
                return fn(model)
        finally:
            model.train(was_training)


class ValueModel(nn.Module):
    """PPO critic: a copy of the policy's transformer body (same initial weights) and a scalar head (zero-init).

    Full fine-tuning: every body weight trains. With LoRA the copy carries its own (copied, still zero-effect)
    adapters and only those and the head train, like the policy; the frozen base weights are a second copy
    in memory either way (the critic's activations differ from the policy's).
    """

    def __init__(self, policy_model: nn.Module):
        super().__init__()
        lora = hasattr(policy_model, "get_base_model")
        base = base_model_of(policy_model)
        body = getattr(base, base.base_model_prefix)
        self.body = copy.deepcopy(body)
        if not lora:
            for p in self.body.parameters():
                p.requires_grad_(True)
        self.body.train()  # dropout is off (load_policy); train mode lets gradient checkpointing apply
        hidden = base.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.head.to(next(self.body.parameters()).device, torch.float32)

    def forward(self, prompt_ids, prompt_mask, comp_ids, comp_mask):
        """Value of the state before each completion token: `[B,T]`."""
        T = comp_ids.shape[1]
        ids = torch.cat([prompt_ids, comp_ids], 1)
        mask = torch.cat([prompt_mask, comp_mask.to(prompt_mask.dtype)], 1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.body(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
        return self.head(hidden[:, -T - 1 : -1].float()).squeeze(-1)
