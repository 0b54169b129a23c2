#!/usr/bin/env bash
# GPU smoke check (issues #5, #6): the embedded default on CUDA, a ~50M-parameter model=hf run,
# and the speed benchmark on CUDA. Usage: scripts/gpu_check.sh OUT_DIR
# Needs rlcompare's Python dependencies importable (pip install -e . on a GPU machine).
set -uo pipefail
OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
export RLCOMPARE_CACHE=${RLCOMPARE_CACHE:-/tmp/rlc_cache} HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"

echo "== 0. preallocated-cache decoding on CUDA (bf16 weights + autocast) against transformers' cache"
$PY - <<'PY'
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from rlcompare.models import build_char_tokenizer
from rlcompare.rollout import left_pad, sample, sequence_logits, token_logp
tok = build_char_tokenizer()
for arch in ("llama", "qwen2", "qwen3"):
    cfg = AutoConfig.for_model(arch, vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                               hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                               intermediate_size=512, max_position_embeddings=256)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg).to("cuda", torch.bfloat16).eval()
    pi, pm = left_pad([[tok.bos_token_id] + list(range(10, 10 + n)) for n in (3, 9, 17)], tok.pad_token_id, "cuda")
    kw = dict(max_new_tokens=64, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, repeats=4, greedy=True,
              autocast_dtype=torch.bfloat16)
    P, PM = pi.repeat_interleave(4, 0), pm.repeat_interleave(4, 0)
    gaps = {}
    for kv in ("auto", "dynamic"):  # each decoder's log-probs against one full forward of its own tokens
        c = sample(m, pi, pm, kv_cache=kv, **kw)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            full = token_logp(sequence_logits(m, P, PM, c.ids, c.mask), c.ids)
        gaps[kv] = f"{((full - c.logp) * c.mask).abs().max():.2e}"
    print(arch, "max |sampler logp - full forward logp|: preallocated", gaps["auto"], "transformers", gaps["dynamic"])
PY

echo "== 1. embedded default on CUDA"
/usr/bin/time -f "wall %e s, max RSS %M KB" $PY -m rlcompare.cli train device=cuda logger=none results_dir="$OUT/results" \
  experiment=gpu trainer.progress=false 2>&1 | grep -E "held-out|wall|Error|error" 

echo "== 2. a ~50M-parameter Llama: warm start (tiny path), saved with save_pretrained, then model=hf for ~2 minutes"
$PY - <<'PY'
import os, json
from hydra import initialize_config_dir, compose
from rlcompare.cli import conf_dir, register_resolvers
from rlcompare.config import validate
from rlcompare.data.prompts import build_prompts
from rlcompare.models import warm_start_tiny
register_resolvers()
with initialize_config_dir(config_dir=conf_dir(), version_base=None):
    c = validate(compose("config", overrides=["model.hidden_size=640", "model.num_layers=10", "model.num_heads=10",
                                               "model.intermediate_size=1920", "model.warm_start.lr=1e-3", "logger=none"]))
folder, key = warm_start_tiny(c.model, c.prompts, build_prompts(c.prompts), device="cuda")
os.symlink(folder, "/tmp/m50") if not os.path.exists("/tmp/m50") else None
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(folder)
print("saved", folder, "params", sum(p.numel() for p in m.parameters()))
PY
timeout 170 $PY -m rlcompare.cli train model=hf model.name_or_path=/tmp/m50 model.dtype=float32 device=cuda logger=none \
  results_dir="$OUT/results" experiment=gpu run_name=hf50m budget.max_steps=150 budget.total_tokens=null trainer.progress=false 2>&1 \
  | grep -E "held-out|Error|error"
$PY - "$OUT/results/gpu/hf50m" <<'PY'
import json, sys, statistics
d = sys.argv[1]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
ev = [json.loads(l) for l in open(d + "/eval.jsonl")]
print("hf50m steps", len(rows), "eval", [(e["step"], e["eval/accuracy"]) for e in ev][::4])
for k in ("time/rollout_s", "time/update_s", "time/step_s", "perf/tokens_per_s"):
    print(k, "median", round(statistics.median(r[k] for r in rows[2:]), 4))
PY

echo "== 3. speed benchmark on CUDA"
$PY -m rlcompare.cli bench --device cuda --sizes ${BENCH_SIZES:-0.5M,25M,0.5B} --steps 5 --warmup 2 --out "$OUT/bench" 2>&1 | tail -40
