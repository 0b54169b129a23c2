"""The embedded tiny model's character tokenizer, made in code (no download). Torch-free, so that `rlcompare train`'s
command-line check can compare a teacher's tokenizer with it before anything heavy loads; `rlcompare.models`
re-exports it."""

from __future__ import annotations

CHARS = list("0123456789+-*/=()., ?:<>_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n")
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]


def build_char_tokenizer():
    """A character-level `PreTrainedTokenizerFast` made in code (no download); save/load like any HF tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.padding_side = "left"
    return fast
