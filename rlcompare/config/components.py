"""The components a sweep variant may declare (docs/components.md): one word -> the config key prefixes it covers.
Read by the sweep's one-change check (rlcompare.sweep.resolve) and the report's config comparison
(rlcompare.report.matching). Plain Python."""

from __future__ import annotations

from typing import Any

# one-word component -> the config key prefixes it covers (a key is covered when it equals a prefix or starts
# with "<prefix>."). Keep in sync with docs/components.md.
COMPONENTS: dict[str, tuple[str, ...]] = {
    "clipping": ("algorithm.clip",),
    "normalization": ("algorithm.advantage",),
    "aggregation": ("algorithm.aggregation", "algorithm.horizon"),
    # a ratio level comes with its own clipping range (GSPO's sequence ratio lives in 1 +- 3e-4..4e-4, a token
    # ratio in 1 +- 0.2; DHPO's hybrid needs the sequence branch's range): changing the ratio may change the range
    "ratio": ("algorithm.ratio", "algorithm.clip"),
    "sampling": ("algorithm.dynamic_sampling", "rollout"),
    # bounded staleness (the algorithmic side of asynchronous RL): how old the trained rollouts are
    "staleness": ("rollout.staleness",),
    # the off-policy corrections (decoupled PPO, the geometric sequence mask, M2PO) compare the proximal policy, the old
    # log-probs recomputed with the current weights, with the sampler's: turning one on turns the recomputation on
    "off_policy": ("algorithm.off_policy", "trainer.recompute_old_logp"),
    "overlong": ("algorithm.overlong",),
    "kl": ("algorithm.kl",),
    "entropy": ("algorithm.entropy_coef",),
    # issue 19: a surrogate comes with its own knobs (algorithm.clip.*), as a ratio level with its range
    "surrogate": ("algorithm.surrogate", "algorithm.clip"),
    # the correction needs the trainer's recomputed old log-probs to compare with the sampler's
    "mismatch": ("algorithm.mismatch", "trainer.recompute_old_logp"),
    "entropy_mask": ("algorithm.top_entropy_quantile",),
    "optimizer": (
        "trainer.lr",
        "trainer.betas",
        "trainer.weight_decay",
        "trainer.warmup_steps",
        "trainer.max_grad_norm",
    ),
    "lr": ("trainer.lr",),
    "group_size": ("trainer.group_size",),
    "batch": ("trainer.prompts_per_step",),
    "updates": ("trainer.updates_per_rollout", "trainer.micro_batch_size"),
    "advantage": ("algorithm.advantage", "algorithm.critic"),
    # on-policy distillation (issue 52): the distill estimator comes with the teacher it reads
    "distillation": ("algorithm.advantage", "teacher"),
    "critic": ("algorithm.critic",),
    "algorithm": ("algorithm",),
    "budget": ("budget",),
    "model": ("model",),
    "prompts": ("prompts",),
    "verifier": ("verifier",),
    # how the held-out prompts are decoded (issue 50): fingerprinted, so a variant changing it declares it
    "eval": ("eval",),
    # multi-turn / tool-use episodes (issue 51): the environment and its turns, budget and reward (env.*)
    "env": ("env",),
    "environment": ("env",),
}


def component_prefixes(component: Any) -> list[str]:
    """Config key prefixes covered by one component or a list of them (words or config paths)."""
    comps = component if isinstance(component, (list, tuple)) else [component]
    out: list[str] = []
    for c in comps:
        if c in COMPONENTS:
            out += [p for p in COMPONENTS[c] if p not in out]
        elif c not in out:
            out.append(str(c))
    return out
