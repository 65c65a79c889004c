#!/usr/bin/env bash
# The GPU measurements of docs/vllm.md and docs/async.md in one call, for a machine with a CUDA GPU and vLLM's GPU
# build installed beside grpolab (make install-vllm VLLM_SPEC='vllm==<version>'; GRPOLAB_VLLM_PYTHON if elsewhere).
# Writes its JSON and logs under ${OUT:-benchmarks-gpu}/. Prepared here; it has not run on a GPU yet (docs/async.md).
#
#   1. vLLM vs grpolab's decoder on the quickstart's rollout batch: mismatch (fp32 and bf16 engine) and rollout time
#   2. a quickstart step, synchronous and asynchronous (k = 0 here / on vLLM, k = 1, 2), vLLM as the worker
#   3. `grpolab bench` on the Qwen3-0.6B recipe (memory fit, trainer-only and end-to-end tokens/s, MFU) beside its
#      estimate, then 10 steps of the recipe (needs the model on the machine or the hub: MODEL=<path> to override)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks-gpu}"
mkdir -p "$OUT"
PY="${PY:-.venv/bin/python}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" benchmarks/vllm_mismatch.py --device cuda --rounds 5 --json-out "$OUT/vllm_mismatch_fp32.json" \
    > "$OUT/vllm_mismatch_fp32.log" 2>&1
"$PY" benchmarks/vllm_mismatch.py --device cuda --rounds 5 --engine-dtype bf16 \
    --json-out "$OUT/vllm_mismatch_bf16.json" > "$OUT/vllm_mismatch_bf16.log" 2>&1
"$PY" benchmarks/async_steps.py --engine vllm --device cuda --threads 0 --steps 10 \
    --json-out "$OUT/async_steps.json" > "$OUT/async_steps.log" 2>&1
RECIPE=configs/gsm8k_qwen3-0.6b.yaml
SET=(${MODEL:+--set model.name=$MODEL})
"$PY" -m grpolab bench "$RECIPE" "${SET[@]}" --estimate "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    --out "$OUT/estimate.json" > "$OUT/estimate.log" 2>&1
"$PY" -m grpolab bench "$RECIPE" "${SET[@]}" --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1
"$PY" -m grpolab train "$RECIPE" "${SET[@]}" --set train.steps=10 --set eval.every_steps=0 \
    --set run.output_dir="$OUT" --set run.name=qwen3-0.6b-10 > "$OUT/recipe.log" 2>&1
tail -n 5 "$OUT"/*.log
