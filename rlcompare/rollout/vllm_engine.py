"""`rollout.engine=vllm`: completions sampled by a vLLM engine built in this process on the policy's weights.

Colocated, as TRL's `vllm_mode=colocate`: one `vllm.LLM` beside the trainer, its engine core in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so that a weight push is vLLM's own in-place reload called on the tensors the
trainer holds, through `LLM.collective_rpc("reload_weights")`. What it keeps of the sampler's contract and what it does not:
docs/vllm.md. The `[vllm]` extra installs it; nothing here imports vllm until an engine is built.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import torch

from rlcompare.fast import base_model_of
from rlcompare.rollout.request import SamplingRequest, request_of
from rlcompare.rollout.sampler import Completions, _completions
from rlcompare.rollout.streams import GroupStreams, group_seed
from rlcompare.rollout.vllm_log import build_warnings_hidden, quiet_vllm

INSTALL_HINT = 'pip install -e ".[vllm]"'  # the extra that brings vllm (pyproject.toml)


def kv_cache_bytes(config, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of KV cache for `tokens` positions of a decoder with this transformers config: keys and values
    of every layer, each `num_key_value_heads x head_dim` numbers of the weights' dtype."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.finfo(dtype).bits // 8 * tokens


def row_seeds(
    rows: int, repeats: int, streams: GroupStreams | None, generator: torch.Generator | None
) -> list[int | None]:
    """vLLM's per-request seed of each of `rows` completions (`repeats` per prompt, contiguous).

    With group streams, completion j of the group keyed k gets `group_seed(*k, j)`: a function of its key alone,
    whatever else shares the batch (vLLM draws a seeded request from a generator of its own). Else the seeds
    come from the run's generator, one draw per rollout, so they follow the batch as the eager sampler's do."""
    if streams is not None:
        if len(streams) != rows:
            raise ValueError(f"{len(streams)} stream rows for {rows} completions")
        return [group_seed(*key, j) for key in streams.keys for j in range(streams.group_size)]
    if generator is None:
        return [None] * rows  # vLLM's own engine seed
    device = generator.device
    return torch.randint(0, 2**62, (rows,), generator=generator, device=device).tolist()


class VllmSampler:
    """`sampler.sample`'s signature (a `SamplingRequest`) and `Completions`, drawn by vLLM; `push(model)` loads new weights into it."""

    def __init__(self, model, *, max_model_len: int, max_num_seqs: int, seed: int):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        base = base_model_of(model)
        quiet_vllm(tied=bool(getattr(base.config, "tie_word_embeddings", False)))  # before vllm logs anything
        from vllm import LLM

        self.folder = tempfile.mkdtemp(prefix="rlcompare-vllm-")
        base.save_pretrained(self.folder)  # config.json and the weights vLLM builds its model from
        dtype = next(base.parameters()).dtype
        try:
            with threads_kept(), build_warnings_hidden():
                self.llm = LLM(
                    model=self.folder,
                    skip_tokenizer_init=True,  # rlcompare tokenizes; the tiny model's char tokenizer is not vLLM's to load
                    dtype=str(dtype).removeprefix("torch."),
                    max_model_len=max_model_len,
                    max_num_seqs=max_num_seqs,
                    kv_cache_memory_bytes=kv_cache_bytes(base.config, max_model_len * max_num_seqs, dtype),
                    logprobs_mode="processed_logprobs",  # after temperature (top-p is refused: config/schema.py)
                    # the CPU build: no torch.compile at start; CUDA: vLLM's graphs (untested here: docs/vllm.md)
                    enforce_eager=next(base.parameters()).device.type != "cuda",
                    seed=seed,
                    disable_log_stats=True,
                    use_tqdm_on_load=False,  # no progress bar for the policy copy it loads once
                )
        finally:
            # the engine holds the weights now and pushes come as tensors: the folder (the policy's size) can go
            shutil.rmtree(self.folder, ignore_errors=True)
        self.sync_s = 0.0  # the last push's seconds (perf/weight_sync_s)

    def push(self, model) -> float:
        """Load `model`'s current weights into the engine and drop its prefix cache, whose keys and values the old
        weights computed; the seconds taken. vLLM's own in-place reload (`Worker.reload_weights`, checkpoint-named
        tensors: it fuses q/k/v and gate/up as on load and reruns what loading does after); the model's bare
        `load_weights` no longer works once loading is done (its parameters have lost their `weight_loader`)."""
        t0 = time.perf_counter()
        weights = [(name, p.detach()) for name, p in base_model_of(model).named_parameters()]
        with threads_kept():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
            self.llm.apply_model(_reprocess_head)
            self.llm.reset_prefix_cache()
        self.sync_s = time.perf_counter() - t0
        return self.sync_s

    def __call__(
        self,
        model,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SamplingRequest | None = None,
        *,
        generator: torch.Generator | None = None,
        streams: GroupStreams | None = None,
        record=False,  # the eager path's speed layer's (`sampler.sample`): nothing to record here
        flop_observer=None,
        **loose,
    ) -> Completions:
        """The completions `request` asks for (`repeats` of each left-padded prompt `[n,P]`, right-padded
        `[n*repeats, T]`, a prompt's completions contiguous), as `sampler.sample` returns them; `model` is unused
        (the engine holds the weights of the last `push`); the request's speed settings (kv_cache, engine,
        sync_every, autocast) are the eager path's. logp: vLLM's processed log-prob of each sampled token
        (temperature applied). `loose`: the request's fields as keywords (`SamplingRequest.of`)."""
        from vllm import SamplingParams

        q = request_of(request, loose)
        eos = torch.tensor(q.eos_ids, dtype=torch.long)
        prompts = [{"prompt_token_ids": row[m.bool()].tolist()} for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]
        rows = len(prompts) * q.repeats
        seeds = [None] * rows if q.greedy else row_seeds(rows, q.repeats, streams, generator)
        params = [
            SamplingParams(
                n=1,
                temperature=0.0 if q.greedy else q.temperature,
                top_p=q.top_p,
                max_tokens=q.max_new_tokens,
                stop_token_ids=eos.tolist(),
                logprobs=0 if q.logprobs else None,  # 0: the sampled token's own log-prob only
                seed=seed,
                detokenize=False,
            )
            for seed in seeds
        ]
        with threads_kept():
            outs = self.llm.generate([p for p in prompts for _ in range(q.repeats)], params, use_tqdm=False)
        return completions_of([o.outputs[0] for o in outs], eos, q.pad_id, q.logprobs, prompt_ids.device)


@contextlib.contextmanager
def threads_kept():
    """torch's CPU thread count (and `torch.set_num_threads` itself) as they were before the block. vLLM sets the
    threads to 1 and replaces torch.set_num_threads for its serving loop, at build and again when its engine runs;
    in-process those would be the trainer's too (2 -> 1 while summary.json's provenance said 2), whose thread count
    is the train entry's (run.apply_process_settings)."""
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _reprocess_head(vllm_model) -> None:
    """Rerun the LM head's after-loading step on its (new) weight. A tied head loads nothing of its own, so the
    reload leaves what its method derived from the old embedding in place (on the CPU, the packed GEMM weight
    `cpu_linear`: the tiny model's tied head then scored tokens with the old weights); repacking is idempotent."""
    head = getattr(vllm_model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(head, "weight"):
        method.process_weights_after_loading(head)


def completions_of(outputs, eos: torch.Tensor, pad_id: int, logprobs: bool, device) -> Completions:
    """vLLM's `CompletionOutput`s as the sampler's `Completions`: ids right-padded to the longest, the mask through
    the first EOS (vLLM keeps the stop token in `token_ids`), log-probs 0 past it."""
    width = max(1, max(len(o.token_ids) for o in outputs))
    ids = torch.full((len(outputs), width), pad_id, dtype=torch.long)
    logp = torch.zeros((len(outputs), width), dtype=torch.float32) if logprobs else None
    for i, o in enumerate(outputs):
        toks = list(o.token_ids)
        ids[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        if logprobs:
            logp[i, : len(toks)] = torch.tensor([lp[t].logprob for t, lp in zip(toks, o.logprobs)])
    c = _completions(ids, logp, eos, pad_id)
    return Completions(
        c.ids.to(device),
        c.mask.to(device),
        c.logp.to(device) if c.logp is not None else None,
        c.truncated.to(device),
        c.lengths.to(device),
    )
