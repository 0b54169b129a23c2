"""The sampler's contract as one value: `SamplingRequest` (rlcompare/rollout/request.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlcompare.rollout.request import SamplingRequest
from rlcompare.rollout.sampler import sample
from tests.rollout.test_rollout import _model, _prompts


def test_the_keyword_form_builds_the_same_frozen_torch_free_request():
    q = SamplingRequest.of(max_new_tokens=5, eos_id=torch.tensor([7, 3]), pad_id=0, autocast_dtype=torch.bfloat16)
    assert q == SamplingRequest(max_new_tokens=5, eos_ids=(7, 3), pad_id=0, autocast="bfloat16")
    assert SamplingRequest.of(max_new_tokens=5, eos_id=7, pad_id=0).eos_ids == (7,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.greedy = True  # type: ignore[misc]


def test_a_request_draws_what_its_keywords_draw_and_both_at_once_are_refused():
    model, tok = _model()
    pi, pm = _prompts(tok, ["3+4=", "1+1="])
    kw = dict(max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=0.7, repeats=3)
    loose = sample(model, pi, pm, generator=torch.Generator().manual_seed(0), **kw)
    request = SamplingRequest.of(**kw)
    got = sample(model, pi, pm, request, generator=torch.Generator().manual_seed(0))
    for name in ("ids", "mask", "logp", "truncated", "lengths"):
        assert torch.equal(getattr(got, name), getattr(loose, name)), name
    with pytest.raises(TypeError, match="not both"):
        sample(model, pi, pm, request, top_p=0.5)
