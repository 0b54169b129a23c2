"""The transformers model under a peft wrapper: what the fast paths, the sampler and models/ all reach through.

Moved here from `models.py` (still importable as `rlcompare.models.base_model_of`): models/ loads the policy and
probes it with the sampler, so the sampler and the fast paths below it cannot import models/ (that was the cycle
models -> rollout -> static_decode -> models).
"""


def base_model_of(model):
    """The transformers model under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
