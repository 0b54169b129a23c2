"""Prompts to token ids, once per run: the encoding training uses, which `rlcompare export` reproduces with the
exported tokenizer (BOS in front where the tokenizer does not add it, a chat model's template)."""

from __future__ import annotations

from dataclasses import dataclass

from rlcompare.config import ConfigError
from rlcompare.data.types import Example


@dataclass
class EncodedPrompt:
    example: Example
    ids: list[int]


def encode_prompts(
    examples: list[Example], tokenizer, *, chat: bool, system_prompt: str | None, max_prompt_tokens: int, split: str
) -> tuple[list[EncodedPrompt], int]:
    """Tokenize once up front; prompts longer than budget.max_prompt_tokens are dropped (and counted)."""
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "prompts.chat=true but the tokenizer has no chat template; set prompts.chat=false or use a chat model"
        )
    add_bos = tokenizer.bos_token_id is not None and not tokenizer_adds_bos(tokenizer)
    out, dropped = [], 0
    for ex in examples:
        if chat:
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
                {"role": "user", "content": ex.prompt}
            ]
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False).input_ids
        else:
            ids = tokenizer(ex.prompt).input_ids
            if add_bos:
                ids = [tokenizer.bos_token_id] + ids
        if len(ids) > max_prompt_tokens:
            dropped += 1
            continue
        out.append(EncodedPrompt(ex, ids))
    if not out:
        raise ConfigError(f"every {split} prompt is longer than budget.max_prompt_tokens={max_prompt_tokens}; raise it")
    return out, dropped


def tokenizer_adds_bos(tokenizer) -> bool:
    ids = tokenizer("1").input_ids
    return bool(ids) and ids[0] == tokenizer.bos_token_id
