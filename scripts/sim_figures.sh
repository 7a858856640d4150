#!/usr/bin/env bash
# Reproduces the simulator figures in the README (the paper's settings: 1 prompt, G=32, M=8). Usage: scripts/sim_figures.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-artifacts/sim}
mkdir -p "$out"
bin=.venv/bin/infsample
run() { echo; echo "\$ infsample $*"; "$bin" "$@"; }

run trace synth --prompts 1 --group-size 32 --max-len 1024 --dist lognormal --seed 0 --out "$out/paper.jsonl"
run simulate --trace "$out/paper.jsonl" --slots 8 --predictor noisy:0.3 --max-len 1024 --plot "$out/paper_slots.png"
run simulate --trace "$out/paper.jsonl" --kv-budget $((8 * (200 + 1024))) --predictor oracle --max-len 1024
run trace synth --prompts 1 --group-size 32 --max-len 1024 --dist bimodal --seed 0 --out "$out/paper_bimodal.jsonl"
run simulate --trace "$out/paper_bimodal.jsonl" --slots 8 --predictor noisy:0.3 --max-len 1024
run trace synth --prompts 64 --group-size 64 --max-len 1024 --dist lognormal --seed 0 --out "$out/batch.jsonl"
run simulate --trace "$out/batch.jsonl" --slots 16 --predictor noisy:0.3 --max-len 1024
run simulate --trace "$out/batch.jsonl" --kv-budget $((8 * (200 + 1024))) --predictor oracle --max-len 1024 \
    --policy continuous,lpt,infinite,oracle --plot "$out/batch_kv.png"
run simulate --trace "$out/batch.jsonl" --slots 8 --policy continuous --max-len 1024
run trace synth --prompts 1024 --group-size 64 --max-len 1024 --dist lognormal --seed 0 --out "$out/big.jsonl"
run simulate --trace "$out/big.jsonl" --slots 16 --predictor noisy:0.3 --policy lpt,infinite --max-len 1024
