"""docs/api.md's worked example: a new surrogate with a knob of its own is one file (examples/shifted_clip.py),
registered after the config schema was imported; its loss by hand, a 2-step run through the CLI's config path,
and a bad value of its knob refused naming the key."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from rlcompare.algos import surrogate_specs, surrogates
from rlcompare.algos.losses import PolicySettings, policy_loss
from rlcompare import registry
from rlcompare.config import ConfigError, validate  # imported before the example registers: keys derive late

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "shifted_clip.py"


@pytest.fixture
def shifted():  # per test: registered only while it runs (xdist interleaves modules on a worker)
    # another test on this worker may have imported examples.shifted_clip (a documented algorithm.module= command):
    # set its registration aside while this one runs, and put it back after
    before = surrogates.SURROGATE_REGISTRY.get("shifted-clip")
    if before is not None:
        surrogates.SURROGATE_REGISTRY.pop("shifted-clip")
        registry.release("surrogate function", "shifted-clip")
        surrogate_specs.unregister("shifted-clip")
    assert "shifted-clip" not in surrogate_specs.SPECS
    spec = importlib.util.spec_from_file_location("shifted_clip_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would (its dataclass reads its module)
    spec.loader.exec_module(module)  # registers the spec and the function
    yield module
    del sys.modules[spec.name]
    surrogates.SURROGATE_REGISTRY.pop("shifted-clip")
    surrogate_specs.unregister("shifted-clip")
    if before is not None:
        registry.release("surrogate function", "shifted-clip")
        importlib.reload(sys.modules[before.__module__])  # its module registers it again


def _batch(rho: list[list[float]]):
    old = torch.full((len(rho), len(rho[0])), math.log(0.5), dtype=torch.float64)
    logp = (old + torch.log(torch.tensor(rho, dtype=torch.float64))).requires_grad_()
    return logp, old


def test_its_loss_on_a_batch_worked_by_hand(shifted):
    # shift 0.1, eps 0.2: the region is [0.9, 1.3]. Row 1, A = +1, rho = (1.25, 0.85): 1.25 inside -> 1.25;
    # 0.85 -> min(0.85, 0.9) = 0.85 (unclipped). Row 2, A = -0.5, rho = (0.85, 1.0): min(-0.425, 0.9 * -0.5 =
    # -0.45) = -0.45 (clipped); 1.0 -> -0.5. J sums to 1.15 over 4 tokens: token-mean loss -0.2875, 1 of 4 clipped.
    # PPO's region [0.8, 1.2] clips 1.25 to 1.2 and keeps -0.425: -(1.2 + 0.85 - 0.425 - 0.5) / 4 = -0.28125.
    logp, old = _batch([[1.25, 0.85], [0.85, 1.0]])
    adv, mask = torch.tensor([1.0, -0.5], dtype=torch.float64), torch.ones(2, 2)
    settings = PolicySettings.from_knobs(surrogate="shifted-clip", eps_low=0.2, eps_high=0.2, shifted_clip_shift=0.1)
    assert settings.own == shifted.ShiftedClipSettings(0.2, 0.2, 0.1)
    loss, m = policy_loss(logp, old, adv, mask, settings)
    assert loss.item() == pytest.approx(-0.2875, abs=1e-12)
    assert m["shifted_clip_frac"] == pytest.approx(0.25)
    # d loss / d logp = -rho A / 4 on the unclipped tokens, 0 on the clipped one
    (grad,) = torch.autograd.grad(loss, logp)
    expected = torch.tensor([[-1.25 / 4, -0.85 / 4], [0.0, 0.5 / 4]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    ppo, _ = policy_loss(logp, old, adv, mask, PolicySettings())
    assert ppo.item() == pytest.approx(-0.28125, abs=1e-12)


def test_it_trains_two_steps_through_the_cli_config_path(shifted, compose, monkeypatch, tmp_path):
    from rlcompare.train.run import train

    # record what the objective saw (the trainer's batch): each step is on-policy (one update per rollout)
    seen = []
    entry = surrogates.SURROGATE_REGISTRY["shifted-clip"]

    def recording(t, s):
        seen.append((t.rho.detach().clone(), t.adv.clone(), t.real.clone(), s))
        return entry.objective(t, s)

    monkeypatch.setitem(surrogates.SURROGATE_REGISTRY, "shifted-clip", dataclasses.replace(entry, objective=recording))
    cfg = compose(
        "algorithm.surrogate=shifted-clip",
        "algorithm.clip.shifted_clip_shift=0.3",  # a plain override: the key is in the composed config
        "budget=tiny",
        "budget.max_steps=2",
        "trainer.updates_per_rollout=1",
        "trainer.micro_batch_size=null",
        "model.warm_start.steps=300",  # the default's shipped warm start: some answers right, advantages not all 0
    )
    assert cfg.algorithm.clip.shifted_clip_shift == 0.3 and cfg.algorithm.clip.cispo_w_max == 5.0
    train(cfg)
    rows = [
        json.loads(line) for line in next((tmp_path / "results").glob("*/*/metrics.jsonl")).read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2] and len(seen) == 2
    for row, (rho, adv, real, s) in zip(rows, seen):
        assert s.shifted_clip_shift == 0.3
        torch.testing.assert_close(rho[real], torch.ones_like(rho[real]))  # on-policy: rho = 1
        # region [1.1, 1.5] leaves rho = 1 out: A > 0 keeps rho A = A, A < 0 takes 1.1 A (the smaller); A = 0: 0
        j = torch.where(adv > 0, adv, 1.1 * adv)[real]
        assert row["objective/per_token"] == pytest.approx(float(j.mean()), rel=1e-5, abs=1e-7)
        assert row["policy/shifted_clip_frac"] == pytest.approx(float((adv[real] < 0).float().mean()), abs=1e-7)
    assert rows[0]["policy/shifted_clip_frac"] > 0  # some advantage was negative


def test_a_bad_value_of_its_knob_is_refused_naming_the_key(shifted, compose):
    with pytest.raises(ConfigError, match=r"^algorithm\.clip\.shifted_clip_shift=1\.5 must be in \(-1, 1\)"):
        validate(compose("algorithm.surrogate=shifted-clip", "algorithm.clip.shifted_clip_shift=1.5"))
    with pytest.raises(ConfigError, match=r"algorithm\.ratio=sequence does not go with algorithm\.surrogate=shifted"):
        validate(compose("algorithm.surrogate=shifted-clip", "algorithm.ratio=sequence"))
    # its knob is signed: a negative shift is its own check's business, not the schema's ">= 0"
    c = validate(compose("algorithm.surrogate=shifted-clip", "algorithm.clip.shifted_clip_shift=-0.2"))
    assert c.algorithm.clip.shifted_clip_shift == -0.2


def test_docs_api_shows_the_example_file_as_it_is():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    section = doc[doc.index("## Adding a surrogate (worked example)") :]
    shown = section[section.index("```python\n") + len("```python\n") :]
    code = EXAMPLE.read_text()
    assert shown[: shown.index("```\n")] == code[code.index("from dataclasses import dataclass") :]
    assert "Files touched: **1**" in section
