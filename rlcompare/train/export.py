"""The trained policy as a Hugging Face folder: `rlcompare export <run dir> [--step N] --out <dir> [--adapter]`,
and `trainer.export_final=true` (the policy at the end of a run, into `<run dir>/export`).

The folder loads with plain transformers (`AutoModelForCausalLM.from_pretrained`, `AutoTokenizer.from_pretrained`):
weights as safetensors, `config.json`, the tokenizer (with its chat template), and `generation_config.json` holding
the run's end tokens (every id that ends a completion in training) and its sampling settings. The tokenizer encodes
a prompt as training did when used as transformers' docs say: where training put BOS in front of a prompt itself
(`prompt_ids.encode_prompts`), the exported tokenizer's post-processor adds it (`tok(prompt)`); a chat run's prompts are
`tok.apply_chat_template(messages, add_generation_prompt=True)` (with prompts.system_prompt as a system message when
the run set one); `model_max_length` is the model's context. Export checks these ids against training's encoding
before the folder is in place. A LoRA run exports
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


NO_ADAPTER = "--adapter: this run trained every weight (no LoRA adapters); export without --adapter"


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: the folder exists and is not empty; give a new folder")


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
        raise ConfigError(NO_ADAPTER)
    if not replace:
        _check_out(out)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if adapter:
            policy.model.save_pretrained(tmp, safe_serialization=True)  # peft: the adapter folder alone
        else:
            model = base_model_of(policy.model) if not policy.lora else _merged(policy.model)
            model.save_pretrained(tmp, safe_serialization=True)
            generation_config(policy, cfg).save_pretrained(tmp)
        export_tokenizer(policy, cfg, tmp)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_tokenizer(policy, cfg, folder: Path) -> None:
    """The training tokenizer into `folder`, set so that plain transformers encodes prompts as training did (BOS
    added by the post-processor where training prepended it; a finite model_max_length), then checked: ConfigError
    when a prompt's ids differ from training's."""
    from transformers import AutoTokenizer

    policy.tokenizer.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)  # a fast tokenizer's files only: no remote code
    if not cfg.prompts.chat and _training_prepends_bos(policy.tokenizer):
        tok.add_bos_token = True  # transformers rebuilds the post-processor (and saves the flag)
    if policy.context_length:
        tok.model_max_length = int(policy.context_length)
    tok.save_pretrained(folder)
    _check_encodes_as_training(policy.tokenizer, AutoTokenizer.from_pretrained(folder), cfg)


def _training_prepends_bos(tokenizer) -> bool:
    from rlcompare.train.prompt_ids import tokenizer_adds_bos

    return tokenizer.bos_token_id is not None and not tokenizer_adds_bos(tokenizer)


CHECK_PROMPTS = ("3+5=", "What is 12 times 7?")  # two texts the check encodes both ways


def _check_encodes_as_training(train_tok, exported, cfg) -> None:
    from rlcompare.data.types import Example
    from rlcompare.train.prompt_ids import encode_prompts

    system = cfg.prompts.system_prompt
    for text in CHECK_PROMPTS:
        (want,), _ = encode_prompts(
            [Example(text, "")],
            train_tok,
            chat=cfg.prompts.chat,
            system_prompt=system,
            max_prompt_tokens=10**9,
            split="export",
        )
        if cfg.prompts.chat:
            msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            got = exported.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
            got = list(got["input_ids"])
        else:
            got = exported(text).input_ids
        if got != want.ids:
            raise ConfigError(
                f"export: the exported tokenizer encodes {text!r} as {got[:12]}, training did as {want.ids[:12]}; "
                f"this tokenizer cannot be exported so that it encodes as training did"
            )


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


def _run_config(run_dir: Path):
    """The run's config.yaml read as data (`rlcompare.config.foreign`: no module it names is imported, its
    model.trust_remote_code is never used); sampling is no part of an export, so a rollout.engine=vllm run loads
    without vLLM installed."""
    from rlcompare.config.foreign import read_run_config

    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"export: {run_dir} holds no config.yaml; give a run folder (results/<experiment>/<run>)")
    cfg = read_run_config(run_dir / "config.yaml", "export")
    if cfg.rollout.engine == "vllm":
        cfg.rollout.engine = "auto"
    return cfg


def load_checkpoint_policy(run_dir: Path, step: int | None = None, cfg=None):
    """(the run's config, its policy with the checkpoint's weights, the checkpoint's step), rebuilt on the CPU as
    training built it. The folder is read as data (`_run_config`)."""
    from rlcompare.config.foreign import reading_as_data

    run_dir = Path(run_dir)
    cfg = _run_config(run_dir) if cfg is None else cfg
    path, blob = _checkpoint_at(run_dir, step)  # before the model loads: a missing step fails fast
    with reading_as_data(f"reading {run_dir}"):
        policy = _rebuilt_policy(cfg)
    weights = blob["policy"]
    if blob.get("lora") != policy.lora:
        raise ConfigError(f"export: checkpoint {path} does not match the run's model.lora.enabled")
    try:
        checkpoint.fits_weights("policy", weights, policy.model.state_dict(), partial=policy.lora)
    except checkpoint.CheckpointError as e:
        raise ConfigError(
            f"export: checkpoint {path} does not fit the model the run's config.yaml builds: {e}"
        ) from None
    policy.model.load_state_dict(weights, strict=not policy.lora)
    if policy.lora and not weights:
        raise ConfigError(f"export: checkpoint {path} holds no adapter weights")
    policy.model.eval()
    return cfg, policy, checkpoint.step_of(path)


def _rebuilt_policy(cfg):
    """The policy `cfg` (a run's config read as data) describes, on the CPU, before the checkpoint's weights."""
    from rlcompare.train.verifier_probe import build_prompt_set
    from rlcompare.models.load import load_policy
    from rlcompare.train.model_folder import check_model

    try:  # its model folder: no code to run (model.trust_remote_code is off for a folder read as data)
        check_model(cfg.model)
    except ConfigError as e:
        raise ConfigError(f"{e} (a run folder is read as data: its model.trust_remote_code is never used)") from None
    return load_policy(cfg, build_prompt_set(cfg), "cpu", log=lambda *a, **k: None)


def export_run(run_dir: Path, out: Path, *, step: int | None = None, adapter: bool = False) -> tuple[Path, int]:
    """(the folder written, the step exported). Requests that cannot succeed are refused before the model loads."""
    run_dir, out = Path(run_dir), Path(out)
    _check_out(out)
    cfg = _run_config(run_dir)
    if adapter and not (cfg.model.kind == "hf" and cfg.model.lora.enabled):
        raise ConfigError(NO_ADAPTER)
    cfg, policy, exported = load_checkpoint_policy(run_dir, step, cfg)
    return export_policy(policy, cfg, out, adapter=adapter), exported


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
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its per-load bars would drown the one line export prints
    try:
        out, step = export_run(Path(args.run_dir), Path(args.out), step=args.step, adapter=args.adapter)
    except ConfigError as e:
        print(f"rlcompare: export error: {e}", file=sys.stderr)
        return 2
    print(f"[rlcompare] exported step {step} of {args.run_dir} to {out}", file=sys.stderr)
    return 0
