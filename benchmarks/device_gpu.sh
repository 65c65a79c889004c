#!/usr/bin/env bash
# The GPU measurements of docs/vllm.md and docs/async.md in one call, for a machine with a CUDA GPU and vLLM's GPU
# build installed beside grpolab with grpolab's plugin (make install-vllm VLLM_SPEC='vllm==<version>';
# GRPOLAB_VLLM_PYTHON if elsewhere). Writes its JSON and logs under ${OUT:-benchmarks-gpu}/. Prepared here; it has not
# run on a GPU yet (docs/async.md).
#
#   1. the vllm_server path: one `vllm serve` with the RL API, a 6-step quickstart on it (benchmarks/server_path.sh):
#      step time, weight sync seconds and bytes
#   2. vLLM vs grpolab's decoder on the quickstart's rollout batch: mismatch (fp32 and bf16 engine) and rollout time
#   3. a quickstart step, synchronous and asynchronous (k = 0 here / on vLLM, k = 1, 2), vLLM as the worker
#   4. `grpolab bench` on the Qwen3-0.6B recipe (memory fit, trainer-only and end-to-end tokens/s, MFU) beside its
#      estimate, then 10 steps of the recipe (needs the model on the machine or the hub: MODEL=<path> to override)
#
# Budget: one call of at most 10 minutes. Each step runs under `timeout` with the seconds given below (guesses until
# the first run on a GPU: a vLLM start is 30-90 s of each vLLM step) and never past BUDGET_S (570 s) from the start;
# a step that fails or runs out of time is reported and the next one still runs; a step with under 20 s left is
# skipped. The last lines: each step's exit code and seconds, then the tail of each log. Exit code: 0 when every step
# succeeded, else 1; 2 when vLLM with grpolab's plugin is absent (nothing run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks-gpu}"
mkdir -p "$OUT"
PY="${PY:-.venv/bin/python}"
VLLM_PY="${GRPOLAB_VLLM_PYTHON:-.venv-vllm/bin/python}"
DEADLINE=$((SECONDS + ${BUDGET_S:-570}))
SUMMARY=()

if ! "$VLLM_PY" -c "import vllm, grpolab_vllm" > /dev/null 2>&1; then
  echo "device_gpu.sh: no vLLM with grpolab's plugin at $VLLM_PY: make install-vllm VLLM_SPEC='vllm==<version>'" \
    "TORCH_SPEC='torch==<its CUDA torch>' (installs both), or GRPOLAB_VLLM_PYTHON=<an environment's python>" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt" || exit 1

step() {  # step NAME SECONDS COMMAND...: COMMAND bounded by SECONDS and by the call's deadline, into $OUT/NAME.log
  local name=$1 budget=$2 left=$((DEADLINE - SECONDS)) began=$SECONDS rc=0
  shift 2
  if [ "$left" -lt 20 ]; then
    SUMMARY+=("$name: skipped, ${left} s of the call's budget left")
    return
  fi
  [ "$budget" -gt "$left" ] && budget=$left
  timeout --kill-after=10 "$budget" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
  SUMMARY+=("$name: exit $rc after $((SECONDS - began)) s (budget $budget s)$([ "$rc" = 124 ] && echo ', timed out')")
}

RECIPE=configs/gsm8k_qwen3-0.6b.yaml
SET=(${MODEL:+--set model.name=$MODEL})
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
step server_path 150 env OUT="$OUT" PY="$PY" GRPOLAB_VLLM_PYTHON="$VLLM_PY" bash benchmarks/server_path.sh
step vllm_mismatch_fp32 75 "$PY" benchmarks/vllm_mismatch.py --device cuda --rounds 5 \
  --json-out "$OUT/vllm_mismatch_fp32.json"
step vllm_mismatch_bf16 75 "$PY" benchmarks/vllm_mismatch.py --device cuda --rounds 5 --engine-dtype bf16 \
  --json-out "$OUT/vllm_mismatch_bf16.json"
step async_steps 150 "$PY" benchmarks/async_steps.py --engine vllm --device cuda --threads 0 --steps 6 \
  --json-out "$OUT/async_steps.json"
step estimate 20 "$PY" -m grpolab bench "$RECIPE" "${SET[@]}" --estimate "$GPU_NAME" --out "$OUT/estimate.json"
step bench 60 "$PY" -m grpolab bench "$RECIPE" "${SET[@]}" --out "$OUT/bench.json"
step recipe 60 "$PY" -m grpolab train "$RECIPE" "${SET[@]}" --set train.steps=10 --set eval.every_steps=0 \
  --set run.output_dir="$OUT" --set run.name=qwen3-0.6b-10

printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
tail -n 5 "$OUT"/*.log 2> /dev/null
! grep -qv ": exit 0 " "$OUT/summary.txt"
