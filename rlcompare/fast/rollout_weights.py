"""The rollout's own copy of the policy's weights, for the graph engine (`graph_decode.py`).

Why: a CUDA graph reads fixed addresses, and under bf16 autocast every decode step would otherwise cast each fp32
weight to bf16 again (at 0.5B that is more memory traffic than the step's own products). The copy holds, per
layer, each projection's weights fused into one matrix (q/k/v; gate/up) in the rollout dtype (the autocast dtype,
else the model's), LoRA adapters merged in (W + scaling * B @ A, no per-step adapter products), and the LM head.
`refresh()` rewrites it in place from the policy (the graph engine calls it at the start of every rollout, so it
always samples with the weights of the last optimizer step).

Same numbers: under autocast, F.linear casts an fp32 weight to the autocast dtype by rounding to nearest, which
is what `.to(dtype)` does once here; only a merged LoRA differs, by the rounding of W + s*B@A against
W x + s * B (A x) (tests/fast/test_graph_decode.py).
"""

from __future__ import annotations

import torch
from torch import nn

from rlcompare.fast import onednn, static_decode
from rlcompare.fast.unwrap import base_model_of


def merged_weight(module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) of a projection module with any active LoRA adapters merged in, or None when the module is
    neither a plain `nn.Linear` nor a peft LoRA linear this can merge (DoRA, LoRA biases, other wrappers)."""
    if type(module) is nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(module, "get_delta_weight") or not hasattr(module, "lora_A"):
        return None
    if any(getattr(module, "use_dora", {}).values()) or any(getattr(module, "lora_bias", {}).values()):
        return None
    weight = base.weight
    if not module.merged and not module.disable_adapters:
        for name in module.active_adapters:
            if name in module.lora_A:
                weight = weight + module.get_delta_weight(name).to(weight.dtype)
    return weight, base.bias


def refusal(model) -> str | None:
    """None when every projection of `model` can be copied (`merged_weight`), else which cannot."""
    for i, layer in enumerate(base_model_of(model).model.layers):
        for mods in static_decode.projection_modules(layer):
            for m in mods:
                if merged_weight(m) is None:
                    return f"layer {i}: {type(m).__name__} is neither nn.Linear nor a mergeable LoRA linear"
    return None


class RolloutWeights:
    """Per layer the four `static_decode._Projection`s (QKV, O, GATE_UP, DOWN) over owned copies in `dtype`, and the
    LM head's weight (`lm_head`). Build under the mode the copies are used in (the sampler's inference mode)."""

    def __init__(self, model, dtype: torch.dtype):
        self.base = base_model_of(model)
        self.dtype = dtype
        self.sources = [static_decode.projection_modules(layer) for layer in self.base.model.layers]
        self.projections = [tuple(static_decode._Projection(mods) for mods in slots) for slots in self.sources]
        for slots, projections in zip(self.sources, self.projections):
            for mods, projection in zip(slots, projections):
                weight, bias = self._fused(mods)
                projection.weight, projection.bias, projection.weight_t = weight, bias, weight.t()
                projection.dnn, projection.packed = onednn.usable(weight), None
        self.lm_head = self.base.lm_head.weight.detach().to(dtype, copy=True)
        self.lm_head_bias = None if self.base.lm_head.bias is None else self.base.lm_head.bias.detach().to(dtype)

    def _fused(self, mods) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The merged weights of `mods` stacked (and their biases, zeros for any without one; None when none has
        one), as new tensors in the copy's dtype."""
        pairs = [merged_weight(m) for m in mods]
        weight = torch.cat([w.detach() for w, _ in pairs], 0).to(self.dtype, copy=True)
        biases = [b for _, b in pairs]
        if all(b is None for b in biases):
            return weight, None
        bias = torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
        return weight, bias.to(self.dtype, copy=True)

    @torch.no_grad()
    def refresh(self) -> None:
        """Rewrite every copy in place from the policy's current weights (addresses unchanged: captured graphs
        read the new values)."""
        for slots, projections in zip(self.sources, self.projections):
            for mods, projection in zip(slots, projections):
                weight, bias = self._fused(mods)
                projection.weight.copy_(weight)
                if bias is not None:
                    projection.bias.copy_(bias)
                projection.packed = None  # oneDNN's packed copy (CPU) is of the old values
        self.lm_head.copy_(self.base.lm_head.weight)
        if self.lm_head_bias is not None:
            self.lm_head_bias.copy_(self.base.lm_head.bias)
