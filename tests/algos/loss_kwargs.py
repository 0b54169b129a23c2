"""The tests' keyword form of `losses.policy_loss` and `losses.cov_selection`: flat knobs named as the config names
them (`algorithm.clip.*`), built into `PolicySettings` the way the trainer builds them, and the aggregation's
totals into `Normalizers`. The worked examples stay readable as one call with the knobs they set."""

from __future__ import annotations

from rlcompare.algos import losses

_TOTALS = ("horizon", "total_tokens", "total_seqs", "group_size", "group_tokens")
_TENSORS = ("entropy", "token_weight", "cov_selected", "generator")


def policy_loss(logp, old_logp, advantages, mask, *, aggregation="token-mean", **kw):
    totals = {k: kw.pop(k) for k in _TOTALS if k in kw}
    tensors = {k: kw.pop(k) for k in _TENSORS if k in kw}
    settings = losses.PolicySettings.from_knobs(**kw)
    norm = losses.Normalizers(**totals)
    return losses.policy_loss(logp, old_logp, advantages, mask, settings, aggregation=aggregation, norm=norm, **tensors)


def cov_selection(logp, old_logp, advantages, mask, *, generator=None, **kw):
    settings = losses.PolicySettings.from_knobs(**kw)
    return losses.cov_selection(logp, old_logp, advantages, mask, settings, generator=generator)
