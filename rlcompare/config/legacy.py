"""Configs of older run folders: what a config.yaml written before a key changed needs to load, resume and compare.

Kept in one module so that a shim is found (and retired) in one place: `upgrade` is what `schema.to_schema` does to
every config before merging it onto the schema; `with_missing_defaults` lets the report's config check and a sweep's
`--resume` compare a folder from before a key existed with a later one.
"""

from __future__ import annotations

from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

# Verifier keys every config held before the verifiers declared their own settings (#54), with the defaults they
# held: a run folder's config.yaml from then still loads (and resumes) where its verifier does not take them.
OLD_VERIFIER_DEFAULTS = {
    "number": "first",
    "require_all": False,
    "pattern": None,
    "partial_credit": False,
    "components": None,
}


def upgrade(user: DictConfig) -> DictConfig:
    """`user` as the schema takes it now: the old verifier keys (OLD_VERIFIER_DEFAULTS) dropped where they hold their
    old default and the verifier no longer takes them."""
    return _without_old_verifier_defaults(user)


def with_missing_defaults(
    fa: dict, fb: dict, defaults: dict, encode: Callable[[Any], Any] = lambda v: v
) -> tuple[dict, dict]:
    """Two flat configs (dotted keys) where a key one lacks and the other holds is filled with what a config
    written without it held: the schema's default (`defaults`: schema.flat_defaults(); a key is added with the
    default that keeps the rows as they were: `algorithm.module`, `verifier.module`, the `env` group), or for a
    verifier key a verifier no longer takes, its old default (OLD_VERIFIER_DEFAULTS). Run folders from before a key
    existed then compare with later ones (the report's config check, a sweep's --resume) on real differences only.
    `encode`: how the caller's flat values are written (the report JSON-encodes lists)."""
    defaults = {**defaults, **{f"verifier.{k}": v for k, v in OLD_VERIFIER_DEFAULTS.items()}}
    fill_a = {k: encode(defaults[k]) for k in fb.keys() - fa.keys() if k in defaults}
    fill_b = {k: encode(defaults[k]) for k in fa.keys() - fb.keys() if k in defaults}
    return ({**fa, **fill_a} if fill_a else fa), ({**fb, **fill_b} if fill_b else fb)


def _without_old_verifier_defaults(user: DictConfig) -> DictConfig:
    v = user.get("verifier") if isinstance(user, DictConfig) else None
    if not isinstance(v, DictConfig):
        return user
    stale = [k for k, d in OLD_VERIFIER_DEFAULTS.items() if k in v and _value(v, k) == d]
    if not stale:
        return user
    from rlcompare.rewards import registry

    registry.names()  # the built-ins registered (a verifier.module's is not imported here: dropping is neutral)
    s = registry.REGISTRY.get(_value(v, "name"))
    try:
        d = OmegaConf.to_container(v, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation into the rest of the config: weighted's components unread
        d = {}
    stale = [k for k in stale if s is None or k not in registry.accepted_keys(s, d)]
    if not stale:
        return user
    user = user.copy()
    user.verifier = OmegaConf.masked_copy(v, [k for k in v.keys() if k not in stale])
    return user


def _value(node: DictConfig, key: str) -> Any:
    try:
        return node[key]
    except Exception:  # noqa: BLE001 - an interpolation that cannot resolve here: not a stale default
        return object()
