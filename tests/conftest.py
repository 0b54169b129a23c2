"""Shared fixtures: Hydra compose against conf/, tiny fast settings, a per-session warm-start cache."""

from __future__ import annotations

import os

import pytest
import torch

from rlcompare.cli import conf_dir, register_resolvers

# Seconds-long runs: a 20-step warm start, 3 RL steps of 4 prompts x 4 completions.
FAST = [
    "budget=tiny",
    "logger=none",
    "trainer.progress=false",
    "model.warm_start.steps=20",
    "prompts.n_eval=16",
    "trainer.prompts_per_step=4",
    "trainer.group_size=4",
    "trainer.eval_every=2",
    "trainer.threads=1",  # 2 threads on a busy 2-core machine thrash; 1 is 10x faster there
    # a 20-step warm start solves nothing: every group's rewards equal, no learning signal (docs/metrics.md, "Run
    # health"); these runs test the mechanics, so they complete with the break recorded
    "trainer.unhealthy=warn",
]


def nan_filled(shape: tuple, *, dtype, device) -> torch.Tensor:
    """`static_decode.unwritten` for the tests: NaN where production code leaves memory uninitialised, so that a
    read of a position nobody wrote fails every time (the NaN reaches a loss or a gradient) instead of once in a
    while, when the memory happened to hold a NaN (a CI run's 2-rank update, skipped by the NaN guard)."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@pytest.fixture(scope="session", autouse=True)
def _unwritten_buffers_are_nan():
    from rlcompare.fast import static_decode

    real, static_decode.unwritten = static_decode.unwritten, nan_filled
    yield
    static_decode.unwritten = real


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("rlc_cache")
    old = os.environ.get("RLCOMPARE_CACHE")
    os.environ["RLCOMPARE_CACHE"] = str(cache)
    os.environ.setdefault("WANDB_SILENT", "true")
    yield cache
    if old is None:
        os.environ.pop("RLCOMPARE_CACHE", None)
    else:
        os.environ["RLCOMPARE_CACHE"] = old


@pytest.fixture
def compose(tmp_path):
    """compose(*overrides, fast=True) -> DictConfig with results under tmp_path."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()

    def _compose(*overrides, fast=True):
        ov = (FAST if fast else []) + [f"results_dir={tmp_path / 'results'}"] + list(overrides)
        with initialize_config_dir(config_dir=conf_dir(), version_base=None):
            cfg = hydra_compose("config", overrides=ov)
        if fast:
            # FAST's trainer.threads=1 is applied by the train entry (rlcompare.train.run.apply_process_settings), not by
            # a Trainer; tests that build a Trainer directly get it here
            import torch

            torch.set_num_threads(1)
        return cfg

    return _compose


def record_step_gradients(trainer) -> list:
    """Wrap `trainer.opt.step` so that each call first records a copy of every parameter's gradient; returns the
    list the copies are appended to (one list of tensors per optimizer step)."""
    grads: list = []
    step = trainer.opt.step

    def recording_step(*a, **kw):
        grads.append([p.grad.detach().clone() for p in trainer.params])
        return step(*a, **kw)

    trainer.opt.step = recording_step
    return grads
