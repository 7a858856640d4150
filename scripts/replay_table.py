"""The README's replay table: ``infsample replay`` over a grid of settings on one GPU and model preset.

Each cell is one run of the replay on a trace from ``infsample trace synth --rl`` with two steps (step 0: the
prompts' first visit; step 1: their revisit, the predictors having seen step 0), every backend. Steps, tokens and
preemptions are vLLM's scheduler's (exact); seconds are the cost model's (modeled).

    python scripts/replay_table.py [--replicas 1,8] [--n 16,64] [--caps 4096,16384] [--pools ample,tight]
        [--samples-per-replica 1024] [--predictors history] [--seed 101] [--json | --markdown]

``--predictors``: ``infinite`` runs once per predictor (``noisy:SIGMA`` stands in for a token-conditioned predictor
of that log-error, revealed after each sample's probe of ``--probe-tokens``); ``gap_closed``: the share of the
engine steps between verl's ``vllm`` and ``oracle`` that it saves.

``--pools``: ample = ``--gpu-memory-utilization 0.9``, tight = 0.5 (verl's default). Prompts per step are chosen so
each replica gets ``--samples-per-replica`` samples (a queue of that over ``max_num_seqs`` = 256).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from verl_infsample.report import format_table, progress
from verl_infsample.core.trace import synth_rl_trace
from infsample_lab.replay.runner import ReplayConfig, replay

POOLS = {"ample": 0.9, "tight": 0.5}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", default="h200")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--replicas", default="1,8")
    p.add_argument("--n", default="16,64")
    p.add_argument("--caps", default="4096,16384")
    p.add_argument("--pools", default="ample,tight")
    p.add_argument("--samples-per-replica", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--predictors", default="history", help="comma-separated: infinite runs once per predictor")
    p.add_argument("--probe-tokens", type=int, default=16)
    p.add_argument("--router", default="verl", help="infinite's router: verl (the product's on vLLM) or group_affinity")
    p.add_argument("--backends", default="vllm,infinite,oracle,transformers")
    p.add_argument("--seed", type=int, default=101)
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help="the README's table: one row per setting and visit")
    args = p.parse_args(argv)
    grid = [(int(r), int(n), int(c), pool) for r in args.replicas.split(",") for n in args.n.split(",")
            for c in args.caps.split(",") for pool in args.pools.split(",")]
    rows = []
    predictors = args.predictors.split(",")
    backends = args.backends.split(",")
    for replicas, n, cap, pool in progress(grid, "replay grid"):
        prompts = max(1, replicas * args.samples_per_replica // n)
        trace = synth_rl_trace(prompts, n, cap, steps=2, seed=args.seed)
        runs = [(tuple(b for b in backends if b != "infinite"), predictors[0])]
        runs += [(("infinite",), pred) for pred in predictors if "infinite" in backends]
        out = []
        t = time.perf_counter()
        for run_backends, predictor in runs:
            config = ReplayConfig(gpu=args.gpu, model=args.model, replicas=replicas,
                                  gpu_memory_utilization=POOLS[pool], max_num_seqs=args.max_num_seqs,
                                  predictor=predictor, router=args.router, seed=args.seed,
                                  probe_tokens=args.probe_tokens,
                                  backends=run_backends)
            out += replay(trace, config)[0]
        wall = time.perf_counter() - t
        base = {r.step: r for r in out if r.backend == "vllm"}
        best = {r.step: r for r in out if r.backend == "oracle"}
        cell = []
        for r in out:
            v, o = base[r.step], best.get(r.step)
            label = f"infinite ({r.predictor})" if r.backend == "infinite" and len(predictors) > 1 else r.backend
            gap = v.engine_steps - o.engine_steps if o else 0
            cell.append({"replicas": replicas, "n": n, "prompts": prompts, "cap": cap, "pool": pool,
                         "kv_blocks": r.kv_blocks, "visit": "first" if r.step == 0 else "revisit",
                         "backend": label, "engine_steps": r.engine_steps,
                         "lower_bound_steps": r.lower_bound_steps,
                         "steps_vs_vllm": round(r.engine_steps / v.engine_steps, 3),
                         "model_s": r.model_s, "time_vs_vllm": round(r.model_s / v.model_s, 3),
                         "gap_closed": round((v.engine_steps - r.engine_steps) / gap, 2) if gap > 0 else None,
                         "preemptions": r.preemptions, "recomputed_tokens": r.recomputed_tokens,
                         "probes": r.probes, "mean_running": r.mean_running, "order_vs_plan": r.order_vs_plan,
                         "plan_checks": r.plan_checks, "replay_wall_s": round(wall, 1)})
        cell.sort(key=lambda r: r["visit"] != "first")
        rows += cell
        print(json.dumps(cell), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    elif args.markdown:
        print(markdown(rows))
    else:
        print(format_table(rows, list(rows[0])))
    return 0


def markdown(rows: list[dict]) -> str:
    """One row per setting and visit: verl's ``vllm`` in engine steps and modeled seconds, every other backend as
    its ratio to it (steps / seconds)."""
    others = list(dict.fromkeys(r["backend"] for r in rows if r["backend"] != "vllm"))
    head = ["replicas", "n", "cap", "KV pool (blocks)", "visit", "vllm steps", "vllm s (modeled)",
            *[f"{b} steps / s vs vllm" for b in others]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = []
    for r in rows:
        key = (r["replicas"], r["n"], r["cap"], r["pool"], r["visit"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        cell = {r["backend"]: r for r in rows if (r["replicas"], r["n"], r["cap"], r["pool"], r["visit"]) == key}
        v = cell["vllm"]
        lines.append("| " + " | ".join([str(key[0]), str(key[1]), f"{key[2] // 1024}k", f"{key[3]} ({v['kv_blocks']})",
                                        key[4], str(v["engine_steps"]), f"{v['model_s']:.0f}",
                                        *[_ratios(cell[b]) if b in cell else "-" for b in others]]) + " |")
    return "\n".join(lines)


def _ratios(row: dict) -> str:
    """Steps / seconds against verl's vllm, and for infinite the share of the step gap to the oracle it closed."""
    text = f"{row['steps_vs_vllm']:.3f} / {row['time_vs_vllm']:.3f}"
    if row["backend"].startswith("infinite") and row.get("gap_closed") is not None:
        text += f" ({row['gap_closed']:.0%})"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
