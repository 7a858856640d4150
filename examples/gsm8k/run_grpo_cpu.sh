#!/usr/bin/env bash
# run_grpo.sh on the CPU: verl's own trainer with the `infinite` rollout server, a tiny offline Qwen3 and the
# offline GSM8K-format sample (examples/gsm8k/preprocess.py --offline-sample, no network), for STEPS (2) steps.
#
#   bash examples/gsm8k/run_grpo_cpu.sh [WORK_DIR] [extra Hydra overrides...]
#
# WORK_DIR (default /tmp/infsample_gsm8k_cpu) gets the parquet files and is the run's working directory.
# Knobs and what makes it run on the CPU: examples/cpu_env.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../cpu_env.sh"
WORK_DIR="${1:-/tmp/infsample_gsm8k_cpu}"
shift $(( $# < 1 ? $# : 1 ))
DATA_DIR="$WORK_DIR/data"
if [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; then
  "$PYTHON" "$HERE/preprocess.py" --local_save_dir "$DATA_DIR" --offline-sample 64
fi
mkdir -p "$WORK_DIR"
cd "$WORK_DIR"
DATA_DIR="$DATA_DIR" bash "$HERE/run_grpo.sh" "$MODEL_PATH" "$NGPUS" "${CPU_OVERRIDES[@]}" \
  trainer.experiment_name=gsm8k_grpo_cpu \
  "$@"
