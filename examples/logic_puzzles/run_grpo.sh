#!/usr/bin/env bash
# GRPO on knights-and-knaves logic puzzles with verl, rollouts by Infinite Sampling (rollout.name=infinite).
#
#   bash examples/logic_puzzles/run_grpo.sh [MODEL_PATH] [NGPUS] [extra Hydra overrides...]
#
# MODEL_PATH (default Qwen/Qwen3-1.7B) and NGPUS (GPUs on this node, default 8). The puzzles are generated offline
# into DATA_DIR (default ~/data/knights_knaves: 5000 train / 500 test, 2..8 inhabitants) on the first run.
# Environment: N (rollout.n, the GRPO group size, default 64), SLOTS (samples decoded at once per replica; unset: as
# many as the engine's KV cache and rollout.max_num_seqs hold), PYTHON. Everything after NGPUS is passed to Hydra
# and wins over the settings below, e.g. trainer.logger=[console].
# On a CPU-only machine use run_grpo_cpu.sh (a tiny model and 2 steps through this same script).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
MODEL_PATH="${1:-Qwen/Qwen3-1.7B}"
NGPUS="${2:-8}"
shift $(( $# < 2 ? $# : 2 ))
DATA_DIR="${DATA_DIR:-$HOME/data/knights_knaves}"
N="${N:-64}"
SLOTS="${SLOTS:-}"

if [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; then
  "$PYTHON" "$ROOT/examples/logic_puzzles/prepare_data.py" --out-dir "$DATA_DIR" --train 5000 --test 500 \
    --min-people 2 --max-people 8 --seed 0
fi

exec "$PYTHON" -m verl.trainer.main_ppo \
  --config-path "$ROOT/configs" --config-name infinite_grpo \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
  data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=32 data.max_prompt_length=1024 data.max_response_length=2048 \
  data.filter_overlong_prompts=true data.truncation=error \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name=infinite actor_rollout_ref.rollout.n="$N" \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.ref.fsdp_config.param_offload=true \
  actor_rollout_ref.rollout.custom.policy=infinite ${SLOTS:+actor_rollout_ref.rollout.custom.slots="$SLOTS"} \
  reward.custom_reward_function.path="$ROOT/examples/logic_puzzles/reward.py" \
  reward.custom_reward_function.name=compute_score \
  trainer.logger='[console]' trainer.project_name=verl_infsample trainer.experiment_name=knights_knaves_grpo \
  trainer.nnodes=1 trainer.n_gpus_per_node="$NGPUS" \
  trainer.val_before_train=true trainer.test_freq=10 trainer.save_freq=50 trainer.total_epochs=3 \
  "$@"
