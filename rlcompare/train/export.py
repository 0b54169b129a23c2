"""The trained policy as a Hugging Face folder: `rlcompare export <run dir> [--step N] --out <dir> [--adapter]`,
and `trainer.export_final=true` (the policy at the end of a run, into `<run dir>/export`).

The folder loads with plain transformers (`AutoModelForCausalLM.from_pretrained`, `AutoTokenizer.from_pretrained`):
weights as safetensors, `config.json`, the tokenizer (with its chat template), and `generation_config.json` holding
the run's end tokens (every id that ends a completion in training) and its sampling settings. A LoRA run exports
the merged model (base + adapters), or with `--adapter` the adapter folder alone (peft's `adapter_config.json` +
`adapter_model.safetensors`). A checkpoint is read through `rlcompare.train.checkpoint` (safetensors + JSON, never
unpickled); the model is rebuilt from the run's `config.yaml` exactly as training built it.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

from rlcompare.config import ConfigError
from rlcompare.train import checkpoint

EXPORT_DIR = "export"  # trainer.export_final's folder inside the run folder


def generation_config(policy, cfg) -> object:
    """The run's end tokens and sampling settings, as transformers' GenerationConfig."""
    from transformers import GenerationConfig

    tok = policy.tokenizer
    return GenerationConfig(
        eos_token_id=policy.eos_ids(),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        do_sample=True,
        temperature=float(cfg.rollout.temperature),
        top_p=float(cfg.rollout.top_p),
        max_new_tokens=int(cfg.budget.max_new_tokens),
    )


def export_policy(policy, cfg, out: Path, *, adapter: bool = False, replace: bool = False) -> Path:
    """Write `policy` (the trainer's `models.Policy`) to `out` as a loadable folder; written under a temporary
    name and renamed, so a failed export leaves no half folder. `replace`: an existing `out` is replaced (the run's
    own export folder), else it must be new or empty. Returns `out`."""
    from rlcompare.fast import base_model_of

    out = Path(out)
    if adapter and not policy.lora:
        raise ConfigError("--adapter: this run trained every weight (no LoRA adapters); export without --adapter")
    if out.exists() and not replace and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: the folder exists and is not empty; give a new folder")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if adapter:
            policy.model.save_pretrained(tmp, safe_serialization=True)  # peft: the adapter folder alone
        else:
            model = base_model_of(policy.model) if not policy.lora else _merged(policy.model)
            model.save_pretrained(tmp, safe_serialization=True)
            generation_config(policy, cfg).save_pretrained(tmp)
        policy.tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_final(cfg, policy, run_dir: Path) -> Path | None:
    """`trainer.export_final=true`: the policy after the last step, into `<run dir>/export` (replacing an earlier one)."""
    if not cfg.trainer.export_final:
        return None
    return export_policy(policy, cfg, Path(run_dir) / EXPORT_DIR, replace=True)


def _merged(peft_model):
    """Base + adapters folded into plain weights, on a copy (the trainer's model keeps its adapters)."""
    return copy.deepcopy(peft_model).merge_and_unload()


def _checkpoint_at(run_dir: Path, step: int | None) -> tuple[Path, dict]:
    """The checkpoint of `step` (default: the newest that reads back), read safely; ConfigError when absent."""
    if step is None:
        try:
            found = checkpoint.read_latest(run_dir)
        except checkpoint.CheckpointError as e:
            raise ConfigError(f"export: no checkpoint of {run_dir} can be read ({e})") from None
        if found is None:
            raise ConfigError(
                f"export: {run_dir} holds no checkpoint; train with trainer.checkpoint_every=N (or "
                f"trainer.export_final=true, which exports at the end of the run)"
            )
        return found
    path = run_dir / "checkpoints" / f"step_{step:08d}"
    if not path.is_dir():
        have = ", ".join(str(checkpoint.step_of(p)) for p in checkpoint.candidates(run_dir)) or "none"
        raise ConfigError(f"export: --step {step}: {run_dir} has no checkpoint of that step (steps held: {have})")
    try:
        return path, checkpoint.read(path)
    except checkpoint.CheckpointError as e:
        raise ConfigError(f"export: checkpoint {path} cannot be read ({e})") from None


def load_checkpoint_policy(run_dir: Path, step: int | None = None):
    """(the run's config, its policy with the checkpoint's weights), rebuilt on the CPU as training built it. The
    folder is read as data (`rlcompare.config.foreign`): no module its config names is imported, and its
    model.trust_remote_code is never used."""
    from rlcompare.config.foreign import read_run_config, reading_as_data

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"export: {run_dir} holds no config.yaml; give a run folder (results/<experiment>/<run>)")
    path, blob = _checkpoint_at(run_dir, step)  # before the model loads: a missing step fails fast
    with reading_as_data(f"reading {run_dir}"):
        cfg = read_run_config(run_dir / "config.yaml", "export")
        policy = _rebuilt_policy(cfg)
    weights = blob["policy"]
    if blob.get("lora") != policy.lora:
        raise ConfigError(f"export: checkpoint {path} does not match the run's model.lora.enabled")
    missing, unexpected = policy.model.load_state_dict(weights, strict=not policy.lora)
    if unexpected or (policy.lora and not weights):
        raise ConfigError(f"export: checkpoint {path} holds weights the model has not: {unexpected[:5]}")
    policy.model.eval()
    return cfg, policy


def _rebuilt_policy(cfg):
    """The policy `cfg` (a run's config read as data) describes, on the CPU, before the checkpoint's weights."""
    from rlcompare.data.verifier_probe import build_prompt_set
    from rlcompare.models.load import load_policy
    from rlcompare.train.model_folder import check_model

    try:  # its model folder: no code to run (model.trust_remote_code is off for a folder read as data)
        check_model(cfg.model)
    except ConfigError as e:
        raise ConfigError(f"{e} (a run folder is read as data: its model.trust_remote_code is never used)") from None
    return load_policy(cfg, build_prompt_set(cfg), "cpu", log=lambda *a, **k: None)


def export_run(run_dir: Path, out: Path, *, step: int | None = None, adapter: bool = False) -> Path:
    cfg, policy = load_checkpoint_policy(run_dir, step)
    return export_policy(policy, cfg, out, adapter=adapter)


def main(argv: list[str]) -> int:
    """`rlcompare export <run dir> [--step N] --out <dir> [--adapter]`."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="rlcompare export", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a run folder (results/<experiment>/<run name>)")
    p.add_argument("--out", required=True, help="the folder to write (new or empty)")
    p.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    p.add_argument("--adapter", action="store_true", help="LoRA runs: the adapter folder alone, not the merged model")
    args = p.parse_args(argv)
    try:
        out = export_run(Path(args.run_dir), Path(args.out), step=args.step, adapter=args.adapter)
    except ConfigError as e:
        print(f"rlcompare: export error: {e}", file=sys.stderr)
        return 2
    print(f"[rlcompare] exported {args.run_dir} to {out}", file=sys.stderr)
    return 0
