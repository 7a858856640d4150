"""What the plan under a KV budget costs, and what it buys: decode steps, preemptions and plan time per workload.

Replays KV-budget workloads through the scheduler (the simulator takes the engine's decisions on the same lengths):
``bench-engine``'s own workload at seeds 0..N-1 (the tiny model's lengths for its 4 prompts x 64, under its
528-token budget), planned on ``history`` (warmed by the earlier rollout, as the bench does) and on exact lengths,
and synthetic traces (lognormal, 1 x 32 and 16 x 16 under token budgets; bimodal 6 x 24 in vLLM's blocks with
``noisy:0.3`` predictions). Steps and preemptions are exact, so a change to the plan's search that keeps every one of
them is a pure speed-up (the totals say so at a glance); plan times are this machine's, and noisy: compare runs
alternated, not one against a figure from another day.

    python scripts/bench_plan.py [--seeds 6] [--synthetic 3] [--json]
"""

import argparse
import json

from infsample_lab.bench.engine import recorded_lengths, recorded_trace, warm_on_recorded
from verl_infsample.report import format_table, progress
from verl_infsample.core import KVBudget, PagedKVBudget, synth_trace
from verl_infsample.predict import make_predictor
from verl_infsample.core.predictor import HistoryPredictor
from verl_infsample.engines import simulate

BENCH_BUDGET = 528  # tokens: docs/engine.md's KV-budget run of bench-engine
BENCH_MAX_NEW_TOKENS = 128


def workloads(seeds: int, synthetic: int, model_dir=None):
    """(name, trace, capacity, max_len, policy, predictor factory) for every workload, in a fixed order."""
    for seed in range(seeds):
        rec = recorded_lengths(seed, max_new_tokens=BENCH_MAX_NEW_TOKENS, model_dir=model_dir)
        trace = recorded_trace(rec)
        budget = KVBudget(BENCH_BUDGET)
        yield f"bench seed {seed}, exact", trace, budget, BENCH_MAX_NEW_TOKENS, "oracle", lambda: "oracle"
        yield (f"bench seed {seed}, history", trace, budget, BENCH_MAX_NEW_TOKENS, "infinite",
               lambda rec=rec: warm_on_recorded(HistoryPredictor(BENCH_MAX_NEW_TOKENS), rec))
    for seed in range(synthetic):
        yield (f"lognormal 1x32 seed {seed}, exact", synth_trace(1, 32, 1024, "lognormal", seed), KVBudget(3000), 1024,
               "oracle", lambda: "oracle")
        yield (f"lognormal 16x16 seed {seed}, exact", synth_trace(16, 16, 1024, "lognormal", seed), KVBudget(6000),
               1024, "oracle", lambda: "oracle")
        yield (f"bimodal 6x24 blocks seed {seed}, noisy", synth_trace(6, 24, 512, "bimodal", seed),
               PagedKVBudget(250, 16, max_running=64), 512, "infinite",
               lambda seed=seed: make_predictor("noisy:0.3", seed=seed, max_len=512))


def run(seeds: int, synthetic: int, model_dir=None) -> list[dict]:
    rows = []
    for name, trace, capacity, max_len, policy, predictor in progress(list(workloads(seeds, synthetic, model_dir)),
                                                                      "workloads"):
        r = simulate(trace, policy, capacity, predictor(), max_len=max_len)
        rows.append({"workload": name, "decode_steps": r.decode_steps, "preemptions": r.preemptions,
                     "plan_ms": round(r.plan_ms, 1)})
    rows.append({"workload": "total", **{k: round(sum(r[k] for r in rows), 1)
                                         for k in ("decode_steps", "preemptions", "plan_ms")}})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=6, help="bench-engine seeds replayed (each: two tiny-model rollouts)")
    p.add_argument("--synthetic", type=int, default=3, help="seeds of each synthetic trace")
    p.add_argument("--model", help="HF checkpoint folder (default: the project's tiny model)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = run(args.seeds, args.synthetic, args.model)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows, ["workload", "decode_steps", "preemptions",
                                                                          "plan_ms"]))


if __name__ == "__main__":
    main()
