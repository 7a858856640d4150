#!/usr/bin/env bash
# run_grpo.sh on the CPU: verl's own trainer (V1, hybrid FSDP2 workers, Ray, TransferQueue, agent loop, reward
# loop) with the `infinite` rollout server, a tiny offline Qwen3 and a few generated puzzles, for STEPS (2) steps.
#
#   bash examples/logic_puzzles/run_grpo_cpu.sh [WORK_DIR] [extra Hydra overrides...]
#
# WORK_DIR (default /tmp/infsample_kk_cpu) gets the puzzle parquet files and is the run's working directory.
# Knobs and what makes it run on the CPU: examples/cpu_env.sh. Prints verl's console metrics, `step:1 - ...`,
# with the rollout servers' infsample/* metrics among them. About 3 minutes on 2 cores.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../cpu_env.sh"
WORK_DIR="${1:-/tmp/infsample_kk_cpu}"
shift $(( $# < 1 ? $# : 1 ))
DATA_DIR="$WORK_DIR/data"
if [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; then
  "$PYTHON" "$HERE/prepare_data.py" --out-dir "$DATA_DIR" --train 64 --test 8 --min-people 2 --max-people 3 --seed 0
fi
mkdir -p "$WORK_DIR"
cd "$WORK_DIR"
DATA_DIR="$DATA_DIR" bash "$HERE/run_grpo.sh" "$MODEL_PATH" "$NGPUS" "${CPU_OVERRIDES[@]}" \
  trainer.experiment_name=knights_knaves_grpo_cpu \
  "$@"
