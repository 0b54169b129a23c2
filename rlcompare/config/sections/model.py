"""`model.*` and `teacher.*`: the models a run loads (the policy: a tiny Llama built in code or any causal LM; on-policy
distillation's teacher), with their accepted values, ranges and checks; what a model's config.json says its
context is (`context_from`).

Whether the budget, the eval and an episode fit in that context reads other sections: rlcompare/config/schema.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig

from rlcompare.config.checks import (
    AT_LEAST_ONE,
    FRACTION,
    MAX_LR,
    PROBABILITY,
    SEED,
    ConfigError,
    Range,
    at_least,
    one_of,
)

MODEL_KINDS = ("tiny", "hf")
DTYPES = ("auto", "bfloat16", "float32", "float16")


# Weight files that unpickle on load (can run code): never loaded (rlcompare.models.load, rlcompare.train.model_folder)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclass
class LoraConfig:
    enabled: bool = False  # train LoRA adapters instead of every weight
    r: int = 8  # LoRA rank
    alpha: int = 16  # LoRA alpha (the update is scaled by alpha / r)
    dropout: float = 0.0  # LoRA dropout
    target_modules: Any = "all-linear"  # modules given adapters: all-linear or a list of names


@dataclass
class WarmStartConfig:
    steps: int = 300  # tiny model: supervised warm-start steps before RL
    batch_size: int = 64  # tiny model: warm-start batch size
    lr: float = 3e-3  # tiny model: warm-start learning rate
    noisy_label_frac: float = 0.5  # share of SFT labels off by one or two
    noise_offsets: Any = field(default_factory=lambda: [1, 2])  # how noisy labels are off (a shared bias RL can undo)
    seed: int = 0  # tiny model: the warm start's seed (its weights are shared by every run seed)


@dataclass
class ModelConfig:
    kind: str = "tiny"  # tiny (a small Llama built in code) | hf (any causal LM)
    name: str = "tiny-llama"  # the model's name (tiny: its identity in fingerprints)
    # tiny: a Llama built from a transformers config, char tokenizer built in code
    hidden_size: int = 128  # tiny: hidden size
    num_layers: int = 2  # tiny: decoder layers
    num_heads: int = 4  # tiny: attention heads (hidden_size / num_heads must be even)
    intermediate_size: int = 256  # tiny: MLP width
    max_position_embeddings: int = 64  # tiny: context length in positions
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    cache_dir: Optional[str] = None  # warm-start cache folder; null: $RLCOMPARE_CACHE or ~/.cache/rlcompare
    # hf: any causal LM, hub id or local folder
    name_or_path: Optional[str] = None  # hf: a hub id, a local folder, or package:<distribution> (its GGUF file)
    gguf_file: Optional[str] = None  # hf: a .gguf file in that folder, read by transformers (gguf package); null: none
    dtype: str = "auto"  # hf: weights dtype: auto | bfloat16 | float32 | float16
    attn_implementation: Optional[str] = (
        None  # hf: transformers' attn_implementation (e.g. sdpa, flash_attention_2); null: its default
    )
    gradient_checkpointing: bool = False  # hf: recompute activations in the backward (less memory, slower)
    trust_remote_code: bool = False  # hf: run the model repository's own code (only for repositories you trust)
    disable_dropout: bool = True  # zero every dropout probability of the loaded model (LoRA's own dropout kept)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class TeacherConfig:
    path: Optional[str] = (
        None  # on-policy distillation's teacher: a causal LM folder, hub id, export or run folder; null: none
    )
    dtype: Optional[str] = None  # the teacher's weights dtype: bfloat16 | float32 | float16; null: the policy's
    device: Optional[str] = None  # the teacher's device; null: the policy's (another device is refused)
    revision: Optional[str] = (
        None  # a hub teacher's commit (40 hex digits), required with a hub id; null: a local folder
    )


RANGES: dict[str, Range] = {  # keys narrower than NON_NEGATIVE (schema.py's RANGES holds every section's)
    "model.warm_start.seed": SEED,
    "model.hidden_size": AT_LEAST_ONE,
    "model.num_layers": AT_LEAST_ONE,
    "model.num_heads": AT_LEAST_ONE,
    "model.intermediate_size": AT_LEAST_ONE,
    "model.max_position_embeddings": AT_LEAST_ONE,
    "model.lora.r": AT_LEAST_ONE,
    "model.lora.alpha": AT_LEAST_ONE,
    "model.lora.dropout": FRACTION,
    "model.warm_start.steps": AT_LEAST_ONE,  # the schedule divides by it; a start from scratch solves nothing
    "model.warm_start.batch_size": AT_LEAST_ONE,
    "model.warm_start.lr": Range(0, MAX_LR, low_open=True),
    "model.warm_start.noisy_label_frac": PROBABILITY,
}


def check(m: DictConfig) -> None:
    """The model: its kind, dtype and (tiny) shape (its numbers' ranges: schema.py's, checked before)."""
    one_of("model.kind", m.kind, MODEL_KINDS)
    one_of("model.dtype", m.dtype, DTYPES)
    if m.kind == "hf" and not m.name_or_path:
        raise ConfigError("model.kind=hf needs model.name_or_path (a hub id or a local folder)")
    if m.kind == "tiny":
        if m.hidden_size % m.num_heads:
            raise ConfigError(f"model.hidden_size={m.hidden_size} must be divisible by model.num_heads={m.num_heads}")
        if (m.hidden_size // m.num_heads) % 2:  # RoPE rotates pairs of dimensions of every head
            raise ConfigError(
                f"model.hidden_size={m.hidden_size} / model.num_heads={m.num_heads} = "
                f"{m.hidden_size // m.num_heads} dimensions per head must be even (rotary "
                f"embeddings rotate pairs); e.g. model.hidden_size=128 model.num_heads=4"
            )
        _check_warm_start(m.warm_start)
        at_least("model.num_layers", m.num_layers, 1)


def _check_warm_start(ws) -> None:
    """The tiny model's supervised warm start draws noisy labels from `noise_offsets` (integers added to answers)."""
    offsets = ws.noise_offsets
    seq = None if isinstance(offsets, (str, bytes, int, float)) else list(offsets)
    ints = seq is not None and all(isinstance(x, int) and not isinstance(x, bool) for x in seq)
    if not ints or (ws.noisy_label_frac > 0 and not seq):
        raise ConfigError(
            f"model.warm_start.noise_offsets={offsets!r} must be a list of integers (how far noisy labels "
            f"are off), non-empty while model.warm_start.noisy_label_frac > 0; e.g. [1, 2]"
        )


# model config.json keys that give the context length (positions), in the order architectures use them
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx", "max_seq_len")


def context_from(d: dict) -> int | None:
    """The context length a model's config (config.json as a dict; a multimodal one's text part) gives, or None."""
    for k in CONTEXT_KEYS:
        v = d.get(k)
        if isinstance(v, int) and v > 0:
            return v
    for sub in ("text_config", "llm_config", "language_config"):
        if isinstance(d.get(sub), dict):
            v = context_from(d[sub])
            if v:
                return v
    return None
