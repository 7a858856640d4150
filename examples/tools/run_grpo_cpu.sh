#!/usr/bin/env bash
# A tool agent on the CPU: verl's own trainer (V1, FSDP2 workers, Ray, agent and reward loops) with
# rollout.name=infinite runs verl's ToolAgentLoop on the tiny "tools" model, which answers arithmetic questions by
# calling a calculator: its first turn writes <tool_call>{"name": "calculator", ...}</tool_call>, verl parses it
# (hermes format), runs the tool, appends its response and asks for the next turn, which answers "answer : 58 .".
#
#   bash examples/tools/run_grpo_cpu.sh [WORK_DIR] [extra Hydra overrides...]
#
# Knobs (environment) and what makes it run on the CPU: examples/cpu_env.sh; here N defaults to 16 (2 prompts x 16
# samples a step), PROMPT_LEN to 256 (the tools' system turn is long), RESPONSE_LEN to 96 (both assistant turns and
# the tool response between them). TOOL=class (default: the BaseTool of calculator_tool.yaml) or function (the same
# calculator as a function tool, function_tools.py). ROLLOUT=vllm runs verl's own vLLM rollout on the same script.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export N="${N:-16}" PROMPT_LEN="${PROMPT_LEN:-256}" RESPONSE_LEN="${RESPONSE_LEN:-96}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
export MODEL_PATH="${MODEL_PATH:-$("$PYTHON" -c 'from infsample_lab.models.tiny import tiny_model_path; print(tiny_model_path(variant="tools"))')}"
source "$HERE/../cpu_env.sh"
case "${TOOL:-class}" in
  class) TOOL_OVERRIDES=(actor_rollout_ref.rollout.multi_turn.tool_config_path="$HERE/calculator_tool.yaml") ;;
  function) TOOL_OVERRIDES=(actor_rollout_ref.rollout.multi_turn.function_tool_path="$HERE/function_tools.py") ;;
  *) echo "TOOL=$TOOL: choose class (calculator_tool.yaml) or function (function_tools.py)" >&2; exit 2 ;;
esac
WORK_DIR="${1:-/tmp/infsample_tools_cpu}"
shift $(( $# < 1 ? $# : 1 ))
DATA_DIR="$WORK_DIR/data"
if [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; then
  "$PYTHON" "$HERE/prepare_data.py" --out-dir "$DATA_DIR" --train 64 --test 8 --seed 0
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
  actor_rollout_ref.actor.optim.lr=1e-4 actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name=infinite actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.multi_turn.enable=true actor_rollout_ref.rollout.multi_turn.format=hermes \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2 actor_rollout_ref.rollout.multi_turn.max_user_turns=1 \
  actor_rollout_ref.rollout.multi_turn.max_parallel_calls=1 \
  actor_rollout_ref.rollout.multi_turn.max_tool_response_length=128 \
  "${TOOL_OVERRIDES[@]}" \
  reward.custom_reward_function.path="$HERE/reward.py" reward.custom_reward_function.name=compute_score \
  trainer.project_name=verl_infsample trainer.nnodes=1 trainer.n_gpus_per_node="$NGPUS" \
  "${CPU_OVERRIDES[@]}" \
  trainer.experiment_name=tools_grpo_cpu \
  "$@"
