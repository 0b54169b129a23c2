"""Tests that import a plug-in in their own process (an example surrogate, estimator, environment or verifier) leave it
registered for the rest of the worker's tests (Hydra's stored config keeps its knobs); a test about the built-ins'
derived names (accepted.SURROGATES, ADVANTAGE_ESTIMATORS, ...) sets those plug-ins aside while it runs."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def builtins_only():
    """The surrogate, estimator and environment specs registered by a module outside rlcompare set aside inside the
    block, and put back, in their registration order, on leaving it."""
    from rlcompare import env_specs, registry
    from rlcompare.algos import estimator_specs, surrogate_specs

    held = {
        "surrogate": surrogate_specs.SPECS,
        "advantage estimator": estimator_specs.SPECS,
        "environment": env_specs.SPECS,
    }
    saved = [dict(d) for d in held.values()]
    for kind, d in held.items():
        for name in [n for n in d if not (registry.owner(kind, n) or "").startswith("rlcompare.")]:
            del d[name]
    _refresh(surrogate_specs)
    try:
        yield
    finally:
        for d, before in zip(held.values(), saved):
            d.clear()
            d.update(before)
        _refresh(surrogate_specs)


def _refresh(surrogate_specs) -> None:
    """The listeners a registration calls (the Hydra app's stored `algorithm.clip` knobs) told of the change, so
    that a config composed inside the block has the built-ins' keys only."""
    for fn in surrogate_specs._LISTENERS:
        fn()
