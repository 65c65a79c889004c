#!/usr/bin/env bash
# The same agent skill learned two ways, paired per seed (docs/agents.md, "OpenAI path against the native path"):
#   native: grpolab's runner, its <tool>open(label)</tool> syntax (configs/agent_lookup.yaml)
#   openai: the unmodified examples/openai_lookup_agent.py through the run's endpoint, Hermes tool calls
#           (configs/openai_agent_lookup.yaml)
# Per seed and path: the light warm start (2 SFT steps on the expert's episodes of the first 16 training states,
# played in that path's format), then STEPS GRPO steps of the configs' recipe, then the held-out evaluation of the
# warm start and the trained model on the same 200 test states (greedy, one episode each, judged by the
# environment). Then `grpolab compare` of the two sets (openai - native over seeds and states).
#
#   bash benchmarks/openai_vs_native_lookup.sh "0 1 2" 20     # the configs' recipe
#   bash benchmarks/openai_vs_native_lookup.sh "0 1 2" 5      # what fits an hour on a 2-vCPU AVX2 CPU in fp32
#
# Finished work is not redone (a directory with its result is kept); delete it to redo.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS="${1:-0 1 2}"
STEPS="${2:-20}"
RUNS="${RUNS:-runs/openai_vs_native}"
G="${GRPOLAB:-.venv/bin/grpolab}"
BASE=bundled:smollm2-135m-instruct
PRECISION="${PRECISION:-fp32}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
BOUNDS=(--task-option env=lookup --task-option difficulty=1 --task-option seed=0 --task-option num_train=2000
  --task-option num_test=200 --task-option max_turns=5 --task-option max_turn_tokens=48
  --task-option max_total_tokens=400 --task-option time_limit_s=5.0)
OPENAI=(--task-option agent=examples/openai_lookup_agent.py:solve --task-option agent_time_limit_s=300
  --task-option max_concurrent=50)
mkdir -p "$RUNS"

for s in $SEEDS; do
  for path in native openai; do
    if [ "$path" = native ]; then TASK=(--task agent); CONFIG=configs/agent_lookup.yaml; EXTRA=()
    else TASK=(--task openai_agent); CONFIG=configs/openai_agent_lookup.yaml; EXTRA=("${OPENAI[@]}"); fi
    SFT="$RUNS/$path-sft-seed$s"; RUN="$RUNS/$path-grpo-seed$s"
    if [ ! -f "$SFT/baseline_manifest.json" ]; then
      rm -rf "$SFT"
      /usr/bin/time -f "== $SFT: warm start in %e s, peak %M KB" "$G" baseline agent-sft "${TASK[@]}" --out "$SFT" \
        --model "$BASE" "${BOUNDS[@]}" "${EXTRA[@]}" --steps 2 --batch-size 8 --lr 5e-5 --limit 16 --seed "$s"
    fi
    if [ ! -f "$RUNS/.$path-grpo-seed$s.trained" ]; then
      rm -rf "$RUN"
      /usr/bin/time -f "== $RUN: trained in %e s, peak %M KB" "$G" train "$CONFIG" --set model.name="$SFT" \
        --set train.seed="$s" --set train.steps="$STEPS" --set train.precision="$PRECISION" \
        --set 'train.memory_fit="off"' --set run.output_dir="$RUNS" --set run.name="$path-grpo-seed$s"
      touch "$RUNS/.$path-grpo-seed$s.trained"
    fi
    if [ ! -f "$RUN/eval/heldout.json" ]; then
      "$G" eval "$SFT" "$RUN" "${TASK[@]}" "${BOUNDS[@]}" "${EXTRA[@]}" --batch-size 50 --out "$RUN/eval/heldout.json"
    fi
  done
done

"$(dirname "$G")/python" benchmarks/openai_vs_native_summary.py "$RUNS" "$SEEDS" | tee "$RUNS/summary.md"
