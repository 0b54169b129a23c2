"""CPU speed paths, each exact (equality-tested against the ordinary path), behind one door (`speed.py`):

* `decoder_for(model, capacity, ...)`: the rollout's decoder (preallocated KV cache, `static_decode.py`, with
  fp32 products through oneDNN, `onednn.py`), or None: transformers' own cache
* `recorded_update_forward(model, recording, rows, ...)`: the first update's logits rebuilt from the sampler's
  projections (`recorded_update.py`), or None: the plain forward
* the graph engine (`graph_decode.py`, `rollout_weights.py`): what `decoder_for(engine="graphs")` returns, a decoder
  that runs the whole rollout from a `SamplingPlan` (the sampler's per-token choice); `ENGINES`: the accepted
  `rollout.engine` values
* `Recording`: the one handle that crosses the door (the sampler's projection outputs); `FlopObserver`: what the
  benchmark passes in to count the fast path's FLOPs
* beside the door: `keep_freed_memory` (`malloc_tuning.py`: malloc settings, applied once by the train entry,
  `trainer.keep_freed_memory`), `base_model_of` (`unwrap.py`: the transformers model under a peft wrapper)

This module is the only way in: code outside `rlcompare/fast/` imports the names in `__all__` from
`rlcompare.fast`, never a submodule (tests/test_layers.py).
"""

from rlcompare.fast.malloc_tuning import keep_freed_memory
from rlcompare.fast.speed import ENGINES, FlopObserver, Recording, SamplingPlan, decoder_for, recorded_update_forward
from rlcompare.fast.unwrap import base_model_of

__all__ = [
    "decoder_for",
    "recorded_update_forward",
    "Recording",
    "FlopObserver",
    "SamplingPlan",
    "ENGINES",
    "keep_freed_memory",
    "base_model_of",
]
