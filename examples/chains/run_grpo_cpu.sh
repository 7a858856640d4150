#!/usr/bin/env bash
# The demo: GRPO that learns, on the CPU. verl's own trainer (V1, FSDP2 workers, Ray, agent and reward loops) with
# rollout.name=infinite trains the tiny "learns" model on chain arithmetic ("add 41 and 7"): the model guesses
# (seldom right) or counts up to the answer (mostly right), and GRPO learns to count, so the mean reward rises.
#
#   bash examples/chains/run_grpo_cpu.sh [WORK_DIR] [extra Hydra overrides...]
#
# Knobs (environment) and what makes it run on the CPU: examples/cpu_env.sh; here STEPS defaults to 10, N to 64,
# BATCH to 8 prompts per step. `python -m infsample_lab.demo` (make demo) runs it and prints a table per step.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export STEPS="${STEPS:-10}" N="${N:-64}" BATCH="${BATCH:-8}" RESPONSE_LEN="${RESPONSE_LEN:-48}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
export MODEL_PATH="${MODEL_PATH:-$("$PYTHON" -c 'from infsample_lab.models.tiny import tiny_model_path; print(tiny_model_path(variant="learns"))')}"
source "$HERE/../cpu_env.sh"
WORK_DIR="${1:-/tmp/infsample_chains_cpu}"
shift $(( $# < 1 ? $# : 1 ))
DATA_DIR="$WORK_DIR/data"
if [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; then
  "$PYTHON" "$HERE/prepare_data.py" --out-dir "$DATA_DIR" --train 512 --test 64 --seed 0
fi
mkdir -p "$WORK_DIR"
cd "$WORK_DIR"
"$PYTHON" -m verl.trainer.main_ppo \
  --config-path "$ROOT/configs" --config-name infinite_grpo \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
  data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/test.parquet" \
  data.filter_overlong_prompts=true data.truncation=error \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 \
  actor_rollout_ref.actor.optim.lr=2e-3 actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name=infinite actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  reward.custom_reward_function.path="$HERE/reward.py" reward.custom_reward_function.name=compute_score \
  trainer.project_name=verl_infsample trainer.nnodes=1 trainer.n_gpus_per_node="$NGPUS" \
  "${CPU_OVERRIDES[@]}" \
  data.max_prompt_length=64 trainer.experiment_name=chains_grpo_cpu \
  "$@"
