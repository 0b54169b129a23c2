"""The sampler's contract: what one call draws, as one frozen value every engine takes (`sampler.sample`, the fast
decoders behind it, `vllm_engine.VllmSampler`).

Torch-free on purpose: the request is settings only. What a call draws its randomness from (the run's generator or
group streams) and the speed layer's handles (a recording to reuse, a FLOP observer) are the call's own arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingRequest:
    """`repeats` completions of each prompt, up to `max_new_tokens` tokens, ended by any of `eos_ids`."""

    max_new_tokens: int  # the completion's budget of new tokens
    eos_ids: tuple[int, ...]  # ids that end a completion (the EOS itself is kept, masked in)
    pad_id: int  # fills the ids after a completion's end
    temperature: float = 1.0  # logits / temperature before the draw and the log-probs
    top_p: float = 1.0  # nucleus filter of the draw (1.0: none)
    greedy: bool = False  # argmax instead of a draw (no randomness consumed)
    repeats: int = 1  # completions per prompt, contiguous in the output
    logprobs: bool = True  # keep each chosen token's log-prob (`Completions.logp`); False skips the work
    autocast: str | None = None  # torch dtype name of the decode's autocast ("bfloat16"), or None: the weights'
    # the eager path's speed settings (`fast.decoder_for`); the vLLM engine ignores them
    kv_cache: str = "auto"  # rollout.kv_cache
    engine: str = "eager"  # rollout.engine
    sync_every: int = 16  # rollout.sync_every

    @classmethod
    def of(cls, *, eos_id: Any, autocast_dtype: Any = None, **fields) -> "SamplingRequest":
        """A request from the keyword form (`eos_id`: an id, a list of ids or a 1-D tensor; `autocast_dtype`: a
        torch dtype or None), which tests and scripts pass to `sample(...)` as loose keywords."""
        eos = eos_id.tolist() if hasattr(eos_id, "tolist") else eos_id
        eos = (eos,) if isinstance(eos, int) else tuple(int(i) for i in eos)
        autocast = str(autocast_dtype).removeprefix("torch.") if autocast_dtype is not None else None
        return cls(eos_ids=eos, autocast=autocast, **fields)


def request_of(request: SamplingRequest | None, loose: dict) -> SamplingRequest:
    """The request of an engine call: `request`, or one built from the loose keywords (`SamplingRequest.of`);
    refuses both at once, which would leave it unclear which settings hold."""
    if request is None:
        return SamplingRequest.of(**loose)
    if loose:
        raise TypeError(f"pass a SamplingRequest or its keywords, not both (got {sorted(loose)} beside a request)")
    return request
