"""Advantage estimators: pure tensor math (torch only, no I/O, no config objects).

Shapes: ``B`` completions, the ``group_size`` completions of one prompt contiguous
(rows ``g*G .. g*G+G-1`` form group ``g``); ``T`` completion tokens; ``mask``
``[B, T]`` is 1/True on real completion tokens, 0/False on padding (bool or 0/1).
Definitions follow docs/algorithms.md section 1.
"""

from __future__ import annotations

import torch

from rlcompare.algos.accepted import GROUP_SCALES, REINFORCE_PP_BASELINES  # torch-free: config validates against them

__all__ = [
    "GROUP_SCALES",
    "REINFORCE_PP_BASELINES",
    "group_advantages",
    "rloo_advantages",
    "gae_advantages",
    "outcome_token_rewards",
    "reinforce_pp_advantages",
    "whiten",
    "informative_groups",
]


def _float(x: torch.Tensor) -> torch.Tensor:
    """Integer/bool/half inputs to float32; float64 stays float64."""
    x = torch.as_tensor(x)
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _grouped(rewards: torch.Tensor, group_size: int, *, min_group: int) -> torch.Tensor:
    """Validate and reshape ``rewards [B]`` to ``[B // G, G]``."""
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size must be an int, got {group_size!r}")
    if group_size < min_group:
        if min_group >= 2:
            raise ValueError(
                f"group_size={group_size}: group advantages need group_size >= 2 "
                "(a group of one has no baseline to compare against)"
            )
        raise ValueError(f"group_size must be >= {min_group}, got {group_size}")
    rewards = _float(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards length {rewards.numel()} is not divisible by group_size={group_size}; "
            "the batch must hold whole groups of contiguous completions"
        )
    return rewards.view(-1, group_size)


def _check_ddof(std_ddof) -> None:
    if std_ddof not in (0, 1) or isinstance(std_ddof, bool):
        raise ValueError(f"std_ddof must be 0 (population std) or 1 (sample std), got {std_ddof!r}")


def _masked_where(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # where (not x*mask) so that inf/NaN at padding cannot leak into sums or gradients
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scale: str = "group",
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantage (GRPO, DeepSeekMath arXiv 2402.03300, Eq. in §4.1.2).

    ``A_i = (R_i - mean_g(R)) / (std + eps)``, centred within each group.

    Args:
        rewards: ``[B]`` scalar reward per completion, groups contiguous.
        group_size: ``G`` (>= 2), completions per prompt.
        scale: ``"group"`` std within the group (GRPO/DAPO/GSPO); ``"batch"`` std over
            the whole batch, still centred per group (Lite-PPO); ``"none"`` centre only
            (Dr. GRPO, arXiv 2503.20783).
        std_ddof: 0 population std, 1 sample std (torch.std, TRL and verl).
        eps: added to the std, avoids division by zero.

    Returns:
        ``[B]`` advantages. A group whose rewards are all equal gets exactly 0.
    """
    if scale not in GROUP_SCALES:
        raise ValueError(f"scale must be one of {', '.join(repr(x) for x in GROUP_SCALES)}, got {scale!r}")
    _check_ddof(std_ddof)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    grouped = _grouped(rewards, group_size, min_group=2)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        adv = centred / (grouped.std(dim=1, correction=std_ddof, keepdim=True) + eps)
    elif scale == "batch":
        adv = centred / (grouped.reshape(-1).std(correction=std_ddof) + eps)
    elif scale == "batch-centered":
        adv = centred / (centred.reshape(-1).std(correction=std_ddof) + eps)
    else:
        adv = centred
    # Force exact zeros for all-equal groups: a float mean need not equal the values bit-for-bit.
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    adv = torch.where(flat, torch.zeros_like(adv), adv)
    return adv.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Leave-one-out baseline (RLOO, arXiv 2402.14740).

    ``A_i = R_i - mean_{j != i} R_j`` within the group, i.e.
    ``G/(G-1) * (R_i - mean_g R)``.

    Args:
        rewards: ``[B]``, groups of ``group_size`` contiguous.
        group_size: ``G`` >= 2.

    Returns:
        ``[B]`` advantages (0 for an all-equal group).
    """
    grouped = _grouped(rewards, group_size, min_group=2)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    adv = grouped - others_mean
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(adv), adv).reshape(-1)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al., arXiv 1506.02438), per token.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` with ``V`` after the last real token = 0,
    ``A_t = sum_l (gamma*lam)^l delta_{t+l}``, ``returns = A + V``.

    Padding positions are skipped (the recursion carries the next real token's value
    and advantage across them, as verl does), so padding anywhere in a row, or extra
    padding columns, never changes a real position's result.

    Args:
        token_rewards: ``[B, T]`` reward per token (outcome score on the last real token,
            plus ``-beta * kl_t`` per token when KL is in the reward).
        values: ``[B, T]`` critic values ``V_t``.
        mask: ``[B, T]`` real-token mask (bool or 0/1).
        gamma: discount; lam: GAE lambda (LLM settings: gamma 1, lam 0.95 or 1.0).

    Returns:
        ``(advantages, returns)``, both ``[B, T]``, 0 at padded positions.
        Not whitened: call :func:`whiten` for PPO's batch whitening.
    """
    if token_rewards.shape != values.shape or values.shape != mask.shape or values.dim() != 2:
        raise ValueError(
            "token_rewards, values and mask must all be [B, T]; got "
            f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}"
        )
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not 0 <= lam <= 1:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")
    real = mask.bool()
    dtype = torch.promote_types(torch.promote_types(token_rewards.dtype, values.dtype), torch.float32)
    r = _masked_where(real, token_rewards.to(dtype))
    v = _masked_where(real, values.to(dtype))
    B, T = v.shape
    next_value = v.new_zeros(B)
    next_adv = v.new_zeros(B)
    advs = [None] * T
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv_t = delta + gamma * lam * next_adv
        is_real = real[:, t]
        # padding: pass the carried value/advantage through untouched
        next_adv = torch.where(is_real, adv_t, next_adv)
        next_value = torch.where(is_real, v[:, t], next_value)
        advs[t] = torch.where(is_real, adv_t, torch.zeros_like(adv_t))
    advantages = torch.stack(advs, dim=1)
    returns = _masked_where(real, advantages + v)
    return advantages, returns


def outcome_token_rewards(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
) -> torch.Tensor:
    """Token-level rewards of an outcome-scored batch: the score on each row's last real token, plus
    ``-beta * kl_t`` on every real token when KL is in the reward (PPO/InstructGPT, REINFORCE++).

    Summed over the row, ``score_i - beta * sum_t kl_t``: the KL-penalised sequence reward that
    group estimators (GRPO, RLOO) centre, as verl's ``token_level_rewards.sum(-1)``.

    Args:
        scores: ``[B]`` outcome reward per completion.
        mask: ``[B, T]`` real-token mask; a row without real tokens gets no score.
        kl: ``[B, T]`` per-token KL estimate (constant), or None.
        beta: KL coefficient (>= 0).

    Returns:
        ``[B, T]`` float, 0 at padding.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    scores = _float(scores).detach()
    if tuple(scores.shape) != (mask.shape[0],):
        raise ValueError(f"scores must be [B] = ({mask.shape[0]},), got {tuple(scores.shape)}")
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0 (the KL coefficient), got {beta!r}")
    real = mask.bool()
    B, T = real.shape
    positions = torch.arange(T, device=real.device).expand(B, T)
    last = (
        torch.where(real, positions, torch.full_like(positions, -1)).max(dim=-1).values
        if T
        else positions.new_full((B,), -1)
    )
    is_last = (positions == last.unsqueeze(-1)) & real
    rewards = torch.where(
        is_last, scores.to(real.device).unsqueeze(-1).expand(B, T), torch.zeros((), dtype=scores.dtype)
    )
    if kl is not None and beta > 0:
        if tuple(kl.shape) != (B, T):
            raise ValueError(f"kl must be [B, T] = {(B, T)}, got {tuple(kl.shape)}")
        rewards = rewards - beta * _masked_where(real, _float(kl).detach().to(rewards.dtype))
    return _masked_where(real, rewards)


def _returns_to_go(rewards: torch.Tensor, real: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = sum_{t' >= t} gamma^{t'-t} r_{t'}`` over real tokens; padding is skipped (the running return is
    carried across it), 0 at padded positions."""
    B, T = rewards.shape
    running = rewards.new_zeros(B)
    out = [None] * T
    for t in reversed(range(T)):
        g = rewards[:, t] + gamma * running
        running = torch.where(real[:, t], g, running)
        out[t] = torch.where(real[:, t], g, torch.zeros_like(g))
    return torch.stack(out, dim=1) if T else rewards.clone()


def reinforce_pp_advantages(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
    gamma: float = 1.0,
    baseline: str = "none",
    group_size: int | None = None,
    std_ddof: int = 1,
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++ and REINFORCE++-baseline (arXiv 2501.03262; OpenRLHF, verl), per token.

    ``baseline="none"`` (REINFORCE++): token rewards from :func:`outcome_token_rewards` (the
    score on the last real token, ``-beta kl_t`` on each, k1 of the rollout policy in the paper),
    return to go ``A_t = sum_{t'>=t} gamma^{t'-t} r_{t'}``. ``baseline="group"``
    (REINFORCE++-baseline): ``A'_i = R_i - mean_g(R)`` with ``R_i = score_i - beta sum_t kl_t``,
    broadcast to the row's tokens (gamma must be 1, as OpenRLHF forces). Both are then whitened
    over all real tokens of the batch, mean and std (:func:`whiten`; ``std_ddof=1`` as verl,
    0 as OpenRLHF; ``eps`` inside the square root, as both).

    Args:
        scores: ``[B]`` outcome rewards (groups of ``group_size`` contiguous for ``"group"``).
        mask: ``[B, T]`` real-token mask.
        kl: ``[B, T]`` per-token KL for the reward, or None; beta: its coefficient.
        gamma: discount in [0, 1].
        baseline: one of :data:`REINFORCE_PP_BASELINES`.
        group_size: ``G`` >= 2, required for ``"group"``.

    Returns:
        ``[B, T]`` advantages, 0 at padding (constants).
    """
    if baseline not in REINFORCE_PP_BASELINES:
        raise ValueError(
            f"baseline must be one of {', '.join(repr(b) for b in REINFORCE_PP_BASELINES)}, got {baseline!r}"
        )
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    _check_ddof(std_ddof)
    real = mask.bool()
    rewards = outcome_token_rewards(scores, mask, kl=kl, beta=beta)
    if baseline == "none":
        raw = _returns_to_go(rewards, real, gamma)
    else:
        if gamma != 1:
            raise ValueError(
                f"baseline='group' needs gamma=1 (every token carries the centred sequence reward), got {gamma!r}"
            )
        if group_size is None:
            raise ValueError("baseline='group' needs group_size (completions per prompt, groups contiguous)")
        grouped = _grouped(rewards.sum(dim=-1), group_size, min_group=2)
        centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
        raw = _masked_where(real, centred.unsqueeze(-1).expand_as(rewards))
    with torch.no_grad():
        return whiten(raw, real, eps=eps, std_ddof=std_ddof)


def whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    std_ddof: int = 1,
) -> torch.Tensor:
    """Whiten over the real tokens of the whole batch (PPO advantage whitening).

    ``(x - mean) / sqrt(var + eps)`` with the masked mean and the masked *sample*
    variance (Bessel-corrected, as TRL's and verl's ``masked_whiten``; ``std_ddof=0``: the
    population variance, as OpenRLHF). With ``shift_mean=False`` the mean is added back
    (scale only).

    Args:
        values: ``[B, T]`` (or any shape matching ``mask``).
        mask: same shape, bool or 0/1.

    Returns:
        Same shape; 0 at padded positions. With no real tokens, all zeros; with one
        real token its variance is taken as 0.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values and mask must have the same shape, got {tuple(values.shape)} and {tuple(mask.shape)}")
    _check_ddof(std_ddof)
    real = mask.bool()
    x = _masked_where(real, _float(values))
    n = real.sum().to(x.dtype)
    mean = x.sum() / n.clamp(min=1)
    centred = _masked_where(real, x - mean)
    var = (centred**2).sum() / (n - std_ddof).clamp(min=1)
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return _masked_where(real, out)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups carry a learning signal (DAPO dynamic sampling, arXiv 2503.14476).

    Args:
        rewards: ``[B]``, groups of ``group_size`` contiguous.

    Returns:
        bool ``[B // group_size]``: True where the group's rewards are not all equal
        (an all-equal group has zero group-relative advantage and zero gradient).
    """
    grouped = _grouped(rewards, group_size, min_group=1)
    return ~(grouped == grouped[:, :1]).all(dim=1)
