"""A new surrogate with a knob of its own, in one file: PPO's clip with its trust region centred at ``1 + shift``.

    J = min(rho A, clip(rho, 1 + shift - eps_low, 1 + shift + eps_high) A)

``shift = 0`` is PPO's clip (arXiv 1707.06347 Eq. 7); ``shift > 0`` lets a token's probability rise further and
stops it falling as far (an optimistic region), ``shift < 0`` the other way. Its knob is the config key
``algorithm.clip.shifted_clip_shift`` (a knob's name is its key: prefix it with the surrogate's name, the keys
of all surrogates share ``algorithm.clip``); PPO's range is read from ``algorithm.clip.eps_low``/``eps_high``.

What this file declares is all there is (docs/api.md, "Adding a surrogate"): the spec gives the config its key,
default, help and check, and every preset composes with the knob at its default; the function is the math.
From the repository's root: ``rlcompare train algorithm.module=examples.shifted_clip
algorithm.surrogate=shifted-clip algorithm.clip.shifted_clip_shift=0.1`` (tests/test_api_example_surrogate_cli.py);
from Python, import this module before the config is composed (tests/test_api_example_surrogate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcompare.algos.ratios import TokenRatios
from rlcompare.algos.surrogate_specs import SurrogateSpec, knob, refuse
from rlcompare.algos.surrogates import register_surrogate


@dataclass(frozen=True)
class ShiftedClipSettings:
    eps_low: float = 0.2  # PPO's range: the common keys algorithm.clip.eps_low / eps_high
    eps_high: float = 0.2
    shifted_clip_shift: float = knob(
        0.0, "shifted-clip: the trust region is centred at 1 + shift, in (-1, 1); 0: PPO's clip", signed=True
    )

    def check(self) -> None:
        shift = self.shifted_clip_shift
        if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not (-1 < shift < 1):
            raise refuse("shifted_clip_shift", shift, "in (-1, 1) (the centre 1 + shift stays > 0)", "e.g. 0.1, or 0")


SPEC = SurrogateSpec(
    name="shifted-clip",
    settings=ShiftedClipSettings,
    metrics=("shifted_clip_frac",),  # logged as policy/shifted_clip_frac
    ratio_levels=("token",),
    doc="PPO's clip centred at 1 + shift (an example: examples/shifted_clip.py)",
)


@register_surrogate(SPEC)  # registers the spec (what the config accepts) and the math
def shifted_clip_objective(t: TokenRatios, s: ShiftedClipSettings) -> tuple[torch.Tensor, dict]:
    centre = 1.0 + s.shifted_clip_shift
    unclipped = t.rho * t.adv
    clipped = t.rho.clamp(centre - s.eps_low, centre + s.eps_high) * t.adv
    # ties go to the unclipped branch so that the gradient flows (on-policy with shift = 0, rho = 1)
    obj = torch.where(clipped < unclipped, clipped, unclipped)
    return obj, {"shifted_clip_frac": t.frac(clipped < unclipped)}
