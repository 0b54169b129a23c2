"""CPU speed paths, each exact (equality-tested against the ordinary path):

* `static_decode.py`: decoding with a preallocated KV cache (`supports(model, capacity)` is None where it applies)
* `replay.py`: the first update's forward rebuilt from the sampler's record (`can_replay(...)` is None where it
  applies)
* `onednn.py`: fp32 products on weights packed once per rollout; `allocator.py`: malloc settings that keep freed
  memory (`trainer.keep_freed_memory`)

This module is the only way in: code outside `rlcompare/fast/` imports the names in `__all__` from
`rlcompare.fast`, never a submodule (tests/test_layers.py).
"""

from rlcompare.fast import replay as _replay
from rlcompare.fast.allocator import keep_freed_memory
from rlcompare.fast.replay import can_replay, replay_logits
from rlcompare.fast.static_decode import ProjectionRecord, StaticDecoder, supports
from rlcompare.fast.unwrap import base_model_of

__all__ = ["supports", "StaticDecoder", "ProjectionRecord", "can_replay", "replay_logits", "keep_freed_memory",
           "base_model_of", "set_flop_listener"]


def set_flop_listener(listener) -> None:
    """`listener(flops)` is told the FLOPs each replayed update computes (`rlcompare bench` counts with it)."""
    _replay.flop_listener = listener
