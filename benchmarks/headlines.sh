#!/usr/bin/env bash
# The README's headlines recomputed (docs/results.md): train each seed of a headline's recipe, evaluate base and
# trained model on its held-out problems, write each run's release report, then the report of the seeds as a set
# (the gate's verdict per run and per set). Every file stays under $RUNS, so the next change can recompute them.
#
#   bash benchmarks/headlines.sh math "0 1 2 3 4"     # make demo's recipe, its evaluation and its report
#   bash benchmarks/headlines.sh code "0 1 2"         # make code-demo's recipe and evaluation
#   bash benchmarks/headlines.sh agents "0 1 2"       # configs/agent_quickstart.yaml
#   bash benchmarks/headlines.sh rg "0 1 2"           # configs/reasoning_gym.yaml
#
# Periodic held-out evaluation is off in training (it changes no update; the evaluation after training is the one
# reported). Capability is products up to 12 x 12 (a task none of the recipes trains on); safety is skipped and
# waived (the bundled base complies with 29 of 30 harmful prompts: nothing to lose); pass@8 is sampled on DIVERSITY_N
# held-out problems. Finished work is not redone: a trained run (marked $RUNS/.NAME.trained) is not retrained, an
# evaluated one not re-evaluated, a reported one not re-reported; delete the run's directory to redo it.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:?usage: headlines.sh math|code|agents|rg \"SEEDS\"}"
SEEDS="${2:-0 1 2}"
RUNS="${RUNS:-runs/headlines}"
G="${GRPOLAB:-.venv/bin/grpolab}"
BASE=bundled:smollm2-135m-instruct
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
REPORT_OPTS=(--capability-task arithmetic --capability-n 100 --capability-option 'operators=*'
  --capability-option max_operand=12 --capability-option terms=2 --capability-max-new-tokens 48
  --skip-safety --waive safety)

case "$WHAT" in
  math)
    CONFIG=configs/quickstart.yaml; DIVERSITY_N="${DIVERSITY_N:-266}"
    EVAL=(--task arithmetic --task-option max_operand=20 --task-option operators=+- --task-option terms=2
      --task-option test_fraction=0.3 --task-option num_test=300 --split test --max-new-tokens 48) ;;
  code)
    CONFIG=configs/code_quickstart.yaml; DIVERSITY_N="${DIVERSITY_N:-64}"
    EVAL=(--task pyfunc --task-option seed=0 --task-option levels=2,3 --task-option test_fraction=0.5 --split test
      --max-new-tokens 64 --samples 4 --temperature 1.0) ;;
  agents)
    CONFIG=configs/agent_quickstart.yaml; DIVERSITY_N="${DIVERSITY_N:-64}"
    EVAL=(--task agent --task-option env=calc --task-option difficulty=1 --task-option seed=0
      --task-option num_train=2000 --task-option num_test=200 --task-option max_turns=2
      --task-option max_turn_tokens=48 --task-option max_total_tokens=160 --task-option time_limit_s=5.0
      --batch-size 50) ;;
  rg)
    CONFIG=configs/reasoning_gym.yaml; DIVERSITY_N="${DIVERSITY_N:-64}"
    EVAL=(--task reasoning_gym:chain_sum --task-option min_terms=2 --task-option max_terms=2
      --task-option min_digits=1 --task-option max_digits=2 --task-option num_test=300 --limit 64
      --max-new-tokens 64) ;;
  *) echo "headlines.sh: unknown headline '$WHAT' (expected math, code, agents or rg)" >&2; exit 2 ;;
esac

DIRS=()
for s in $SEEDS; do
  RUN="$RUNS/$WHAT-seed$s"
  DIRS+=("$RUN")
  if [ -f "$RUN/report.md" ]; then echo "== $RUN: reported already"; continue; fi
  TRAINED="$RUNS/.$WHAT-seed$s.trained"
  if [ ! -f "$TRAINED" ] || [ ! -d "$RUN" ]; then  # a run whose training was cut short is trained again
    rm -rf "$RUN"
    /usr/bin/time -f "== $RUN: trained in %e s, peak %M KB" "$G" train "$CONFIG" --set train.seed="$s" \
      --set eval.every_steps=0 --set rollout.engine=grpolab --set run.output_dir="$RUNS" --set run.name="$WHAT-seed$s"
    touch "$TRAINED"
  fi
  if [ ! -f "$RUN/eval/base_vs_trained.json" ]; then
    "$G" eval "$BASE" "$RUN" "${EVAL[@]}" --out "$RUN/eval/base_vs_trained.json"
  fi
  /usr/bin/time -f "== $RUN: reported in %e s" "$G" report "$RUN" "${REPORT_OPTS[@]}" --diversity-n "$DIVERSITY_N"
done
if [ "${#DIRS[@]}" -gt 1 ]; then
  "$G" report "${DIRS[@]}" "${REPORT_OPTS[@]}" --diversity-n "$DIVERSITY_N" --out "$RUNS/$WHAT-set"
fi
