"""Issue 19's knobs reach the trainer: micro-batches and the rebuild fast path give the same update for the
step-level statistics (top-entropy threshold, Cov selection, prompt-mean), KL in the reward for every estimator,
the mismatch correction weights the update, bad settings are refused naming the key, and the sweep components
isolate each knob."""

from __future__ import annotations

import textwrap

import pytest
import torch

from rlcompare.algos import advantages as adv_lib
from rlcompare.config import ConfigError, validate
from rlcompare.sweep import SweepError, check_one_change, load_sweep, resolve_members
from rlcompare.train.trainer import Trainer
from conftest import record_step_gradients


def _informative(b):
    b.rewards = torch.linspace(0, 1, len(b.rewards))  # every group informative
    return b


def _first_gradient(compose, tmp_path, name: str, *overrides: str):
    """The gradient AdamW receives at the first optimizer step of one update on a fixed batch."""
    tr = Trainer(validate(compose(*overrides)), tmp_path / name)
    b = _informative(tr.collect().batch)
    grads = record_step_gradients(tr)
    up = tr.update(b, tr.targets.advantages(b), b.completions.logp).metrics
    return b, up, grads[0]


def _assert_same(g_ref, g):
    scale = max(float(x.abs().max()) for x in g_ref)
    assert scale > 0
    for x, y in zip(g_ref, g):
        torch.testing.assert_close(y, x, atol=1e-5 * scale, rtol=0)


# 4 prompts x 4 completions, 2 mini-batches of 2 groups; kl-cov selects by covariance over the whole mini-batch,
# the entropy threshold is over the mini-batch, prompt-mean weighs each group by its own token count
STEP_STATS = [
    "algorithm.surrogate=kl-cov",
    "algorithm.clip.cov_ratio=0.05",
    "algorithm.top_entropy_quantile=0.5",
    "algorithm.aggregation=prompt-mean-token-mean",
    "algorithm.kl.coef=0",
    "trainer.updates_per_rollout=2",
]


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_micro_batches_give_the_same_update_with_step_level_statistics(compose, tmp_path):
    b_ref, up_ref, g_ref = _first_gradient(compose, tmp_path, "whole", *STEP_STATS, "trainer.update_from_rollout=false")
    b, up, g = _first_gradient(
        compose, tmp_path, "micro", *STEP_STATS, "trainer.update_from_rollout=false", "trainer.micro_batch_size=4"
    )  # one group per micro-batch: 2 per optimizer step
    assert torch.equal(b_ref.completions.ids, b.completions.ids)
    _assert_same(g_ref, g)
    assert up["entropy_mask_kept_frac"] == pytest.approx(up_ref["entropy_mask_kept_frac"], abs=1e-6)
    assert up["cov_selected_frac"] == pytest.approx(up_ref["cov_selected_frac"], abs=1e-6)
    assert 0 < up["entropy_mask_kept_frac"] < 1 and up["cov_selected_frac"] > 0
    # the mask is really applied: without it the gradient differs
    _, _, g_all = _first_gradient(
        compose,
        tmp_path,
        "nomask",
        *STEP_STATS[:1],
        *STEP_STATS[2:],
        "algorithm.top_entropy_quantile=null",
        "trainer.update_from_rollout=false",
    )
    assert any(not torch.allclose(x, y, atol=1e-6) for x, y in zip(g_ref, g_all))


@pytest.mark.parametrize("extra", [[], ["trainer.micro_batch_size=4"]])
@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_the_rebuild_fast_path_gives_the_same_update_for_the_new_modes(compose, tmp_path, extra):
    # ScaleRL's loss without its zero-variance filter (the short warm start gives flat groups), with the entropy
    # mask on top (its threshold from the step's own forward, or from the no-graph pass with micro-batches)
    modes = [
        "algorithm.surrogate=cispo",
        "algorithm.aggregation=prompt-mean-token-mean",
        "algorithm.advantage.scale=batch-centered",
        "algorithm.top_entropy_quantile=0.5",
        "algorithm.kl.coef=0",
        "trainer.updates_per_rollout=2",
        *extra,
    ]
    _, _, g_ref = _first_gradient(compose, tmp_path, "ordinary", *modes, "trainer.update_from_rollout=false")
    b, _, g = _first_gradient(compose, tmp_path, "rebuild", *modes)
    assert b.completions.recording is not None  # the first mini-batch was rebuilt from the sampler's projections
    _assert_same(g_ref, g)


@pytest.mark.parametrize("estimator", ["group", "rloo", "reinforce_pp"])
def test_kl_in_the_reward_for_every_advantage_estimator(compose, tmp_path, estimator):
    scale = {"group": "group", "rloo": "none", "reinforce_pp": "whiten"}[estimator]
    beta = 0.5
    tr = Trainer(
        validate(
            compose(
                f"algorithm.advantage.estimator={estimator}",
                f"algorithm.advantage.scale={scale}",
                "algorithm.kl.placement=in_reward",
                "algorithm.kl.estimator=k1",
                f"algorithm.kl.coef={beta}",
            )
        ),
        tmp_path / estimator,
    )
    b = _informative(tr.collect().batch)
    comp = b.completions
    assert comp.logp is not None  # the sampler's log-probs are kept: the penalty reads them
    av = tr.targets.advantages(b)
    m = comp.mask.bool()
    k1 = torch.where(m, comp.logp - av.ref_logp, torch.zeros(()))  # log pi_old / pi_ref
    assert k1.abs().max() > 0
    penalised = b.rewards - beta * k1.sum(-1)  # score - beta sum_t kl_t
    if estimator == "group":
        want = adv_lib.group_advantages(penalised, 4)
    elif estimator == "rloo":
        want = adv_lib.rloo_advantages(penalised, 4)
    else:  # the return to go of -beta kl_t plus the score on the last token, whitened over the batch's tokens
        G = torch.flip(torch.cumsum(torch.flip(torch.where(m, -beta * k1, torch.zeros(())), [1]), 1), [1])
        G = G + torch.where(m, b.rewards.unsqueeze(-1), torch.zeros(()))
        mean = G[m].mean()
        want = torch.where(
            m, (G - mean) / torch.sqrt(((G[m] - mean) ** 2).sum() / (m.sum() - 1) + 1e-6), torch.zeros(())
        )
    torch.testing.assert_close(av.advantages, want, atol=1e-5, rtol=1e-5)


def _step_with(compose, tmp_path, name: str, gap: float, *overrides: str):
    """One training step in which the trainer's recomputed old log-probs sit `gap` nats above the sampler's."""
    tr = Trainer(
        validate(
            compose(
                "algorithm.kl.coef=0", "trainer.updates_per_rollout=1", "trainer.recompute_old_logp=true", *overrides
            )
        ),
        tmp_path / name,
    )
    collect, recompute = tr.collect, tr.targets.recompute_logp

    def informative_collect():
        col = collect()
        _informative(col.batch)
        return col

    tr.collect = informative_collect
    tr.targets.recompute_logp = lambda b: recompute(b) + gap * b.completions.mask
    before = [p.detach().clone() for p in tr.params]
    row = tr.step()
    moved = any(not torch.equal(p, q) for p, q in zip(tr.params, before))
    return row, moved


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_mismatch_correction_weights_the_update(compose, tmp_path):
    # a gap of 1 nat per token: every row's product e^{|o|} > 2 -> sequence-mask zeroes every weight, no update
    row, moved = _step_with(compose, tmp_path, "masked", 1.0, "algorithm.mismatch.mode=sequence-mask")
    assert row["mismatch/masked_frac"] == 1.0 and row["policy/token_weight_mean"] == 0.0 and not moved
    assert row["mismatch/logp_gap_max"] == pytest.approx(1.0, abs=1e-4)
    # token-truncate at 2: e^1 = 2.718 -> 2 on every token
    row, moved = _step_with(compose, tmp_path, "truncated", 1.0, "algorithm.mismatch.mode=token-truncate")
    assert row["mismatch/truncated_frac"] == 1.0 and row["policy/token_weight_mean"] == pytest.approx(2.0) and moved
    # the same engine: the recomputed log-probs agree with the sampler's to float noise, weights ~1
    row, _ = _step_with(compose, tmp_path, "same", 0.0, "algorithm.mismatch.mode=icepop")
    assert row["mismatch/logp_gap_max"] < 1e-4 and row["mismatch/masked_frac"] == 0.0


def test_step_level_statistics_turn_the_zero_advantage_skip_off(compose, tmp_path):
    tr = Trainer(
        validate(
            compose("algorithm.kl.coef=0", "trainer.skip_zero_advantage=true", "algorithm.top_entropy_quantile=0.2")
        ),
        tmp_path / "run",
    )
    b = tr.collect().batch
    b.rewards = torch.tensor([1.0] * 4 + [0.0] * 4 + [0.0, 1.0, 0.0, 1.0] + [1.0] * 4)  # 3 flat groups
    up = tr.update(b, tr.targets.advantages(b), b.completions.logp)
    assert up.idle_rows_frac == 0.0  # the flat groups' tokens are in the entropy quantile's pool


# ---------------------------------------------------------------- bad settings are refused naming the key


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["algorithm.surrogate=ppo"], r"algorithm.surrogate='ppo' is not accepted; use one of: clip, cispo, sapo"),
        (
            ["algorithm.surrogate=cispo", "algorithm.ratio=sequence"],
            r"algorithm.ratio=sequence does not go with algorithm.surrogate=cispo; use one of: token",
        ),
        (
            ["algorithm.surrogate=cispo", "algorithm.clip.dual_clip=3"],
            r"algorithm.clip.dual_clip=3.0 applies to algorithm.surrogate=clip only",
        ),
        (
            ["algorithm.surrogate=cispo", "algorithm.clip.cispo_w_max=0"],
            r"algorithm.clip.cispo_w_max=0.0 must be a number > 0 or null; e.g. 5.0 \(ScaleRL\), or null \(no upper bound\) \(algorithm.surrogate=cispo\)",
        ),
        (
            ["algorithm.surrogate=sapo", "algorithm.clip.sapo_tau_pos=-1"],
            r"algorithm.clip.sapo_tau_pos=-1.0 must be a number > 0",
        ),
        (
            ["algorithm.surrogate=clip-cov", "algorithm.clip.cov_lb=6"],
            r"algorithm.clip.cov_lb=6.0 must be < algorithm.clip.cov_ub=5.0",
        ),
        (
            ["algorithm.mismatch.mode=tis", "trainer.recompute_old_logp=true"],
            r"algorithm.mismatch.mode='tis' is not accepted; use one of: token-truncate, .*icepop, or null",
        ),
        (["algorithm.mismatch.mode=icepop"], r"algorithm.mismatch.mode=icepop .*set trainer.recompute_old_logp=true"),
        (
            ["algorithm.mismatch.mode=token-mask", "trainer.recompute_old_logp=true", "algorithm.mismatch.c_max=0"],
            r"algorithm.mismatch.c_max must be a finite number > 0",
        ),
        (["algorithm.top_entropy_quantile=1.5"], r"algorithm.top_entropy_quantile=1.5 must be in \[0, 1\]"),
        (
            ["algorithm.advantage.estimator=reinforce_pp"],
            r"algorithm.advantage.scale \(estimator=reinforce_pp\)='group' is not accepted; use one of: whiten",
        ),
        (
            [
                "algorithm.advantage.estimator=reinforce_pp",
                "algorithm.advantage.scale=whiten",
                "algorithm.advantage.baseline=rloo",
            ],
            r"algorithm.advantage.baseline='rloo' is not accepted; use one of: none, group",
        ),
        (
            [
                "algorithm.advantage.estimator=reinforce_pp",
                "algorithm.advantage.scale=whiten",
                "algorithm.advantage.baseline=group",
                "algorithm.advantage.gamma=0.9",
            ],
            r"algorithm.advantage.gamma=0.9 must be 1 with algorithm.advantage.baseline=group",
        ),
        (["algorithm.advantage.scale=batch-centred"], r"use one of: group, batch, batch-centered, none"),
        (["algorithm.kl.estimator=k4"], r"algorithm.kl.estimator='k4' is not accepted; use one of: k1, k2, k3, k3\+"),
        (["algorithm.aggregation=prompt-mean"], r"use one of: .*prompt-mean-token-mean"),
    ],
)
def test_bad_variant_settings_name_the_key(compose, overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose(*overrides))


def test_good_variant_settings_validate(compose):
    c = validate(
        compose(
            "algorithm.surrogate=dppo-kl",
            "algorithm.clip.dppo_delta_low=0.05",
            "algorithm.aggregation=prompt-mean-token-mean",
            "algorithm.kl.estimator=k3+",
            "algorithm.kl.placement=in_reward",
            "algorithm.top_entropy_quantile=0.2",
            "algorithm.mismatch.mode=icepop",
            "trainer.recompute_old_logp=true",
        )
    )
    assert c.algorithm.surrogate == "dppo-kl" and c.algorithm.clip.dppo_delta_low == 0.05


# ---------------------------------------------------------------- the sweep components isolate each knob


def _members(tmp_path, variants: str):
    p = tmp_path / "s.yaml"
    p.write_text(
        textwrap.dedent("""
        name: knobs
        seeds: [0]
        base: {label: grpo, overrides: [algorithm=grpo]}
        variants:
        """)
        + textwrap.indent(textwrap.dedent(variants), "  ")
    )
    return resolve_members(load_sweep(p), [f"results_dir={tmp_path / 'results'}"])


@pytest.mark.slow
def test_new_components_cover_their_knobs(tmp_path):
    check_one_change(
        _members(
            tmp_path,
            """
        - {label: cispo, component: surrogate, overrides: [algorithm.surrogate=cispo, algorithm.clip.cispo_w_max=4.0]}
        - {label: tis, component: mismatch, overrides: [algorithm.mismatch.mode=token-truncate, trainer.recompute_old_logp=true]}
        - {label: top20, component: entropy_mask, overrides: [algorithm.top_entropy_quantile=0.2]}
        - {label: k3plus, component: kl, overrides: [algorithm.kl.estimator=k3+]}
        - {label: scalerl_norm, component: normalization, overrides: [algorithm.advantage.scale=batch-centered]}
        - {label: prompt_mean, component: aggregation, overrides: [algorithm.aggregation=prompt-mean-token-mean]}
        """,
        )
    )
    with pytest.raises(
        SweepError, match=r"(?s)'sapo' declares component surrogate .*algorithm.aggregation: seq-mean-token-mean"
    ):
        check_one_change(
            _members(
                tmp_path,
                """
            - {label: sapo, component: surrogate, overrides: [algorithm.surrogate=sapo, algorithm.aggregation=token-mean]}
            """,
            )
        )
