#!/usr/bin/env bash
# GPU memory of plain GRPO sampling vs Infinite Sampling on TransformersEngine (no vLLM, no verl); one JSON line.
#   scripts/gpu_check_transformers.sh            one GPU, $PYTHON (default python3) with torch + transformers:
#                                                Qwen3-1.7B shape, random weights, rollout.n in {32, 256, 1024}
#   scripts/gpu_check_transformers.sh --dry-run  CPU: .venv/ (make setup), tiny Qwen3 shape, n in {8, 32}
# Extra arguments go to `python -m infsample_lab.bench.gpu_check_transformers` (--help lists them). Nothing is
# downloaded. This is the GPU check a machine without vLLM can run (scripts/gpu_check.sh needs vLLM).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --dry-run "* ]]; then
    make -s setup
    PYTHON=${PYTHON:-.venv/bin/python}
else
    PYTHON=${PYTHON:-python3}
fi
"$PYTHON" -c "import torch, transformers, numpy" 2>/dev/null || {
    echo "gpu_check_transformers: $PYTHON cannot import torch, transformers and numpy" >&2
    exit 2
}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout 480 "$PYTHON" -m infsample_lab.bench.gpu_check_transformers "$@"
