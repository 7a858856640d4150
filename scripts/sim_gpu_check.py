"""verl's plain submission against Infinite Sampling on a random-weights model's lengths, in the simulator.

The setting: 2 prompts of 256 tokens, rollout.n in {32, 256, 1024}, a
random-weights model's lengths (each step stops a sample with probability 3 / 1024: geometric, capped at 1024), KV
for 64 worst-case sequences in blocks of 16 (vLLM's paged budget), at most 256 running (verl's max_num_seqs).
Per n: `plain` (verl's submission: all at once, preempt when the blocks run out), `oracle` (the plan with the true
lengths) and `infinite` with `history` warmed by one rollout at another seed. Decode steps, preemptions and
recomputed tokens; simulated, so a preemption's recompute is charged as one prefill pass per readmission batch.

    python scripts/sim_gpu_check.py [--n 32 --n 256 --n 1024] [--json]
"""

import argparse
import json

import numpy as np

from verl_infsample.report import format_table
from verl_infsample.core import PagedKVBudget, TracePrompt
from verl_infsample.predict import make_predictor
from verl_infsample.engines import simulate

PROMPT, MAX_NEW, KV_SEQS, BLOCK, MAX_RUNNING = 256, 1024, 64, 16, 256


def geometric_trace(n: int, seed: int) -> list[TracePrompt]:
    rng = np.random.default_rng(seed)
    return [TracePrompt(f"p{g}", PROMPT, tuple(int(x) for x in np.minimum(MAX_NEW, rng.geometric(3 / MAX_NEW, n))))
            for g in range(2)]


def compare(n: int) -> list[dict]:
    """One row per policy for rollout.n = ``n``."""
    budget = PagedKVBudget(KV_SEQS * (PROMPT + MAX_NEW) // BLOCK, BLOCK, max_running=MAX_RUNNING)
    trace, rows = geometric_trace(n, seed=0), []
    for policy, predictor in (("plain", "none"), ("oracle", "oracle"), ("infinite", "history")):
        pred = make_predictor(predictor, max_len=MAX_NEW)
        if predictor == "history":
            simulate(geometric_trace(n, seed=1), policy, budget, pred, max_len=MAX_NEW)  # the previous epoch
        r = simulate(trace, policy, budget, pred, max_len=MAX_NEW)
        rows.append({"n": n, "policy": policy, "predictor": r.predictor, "decode_steps": r.decode_steps,
                     "lower_bound_steps": r.lower_bound_steps, "preemptions": r.preemptions,
                     "recompute_tokens": r.recompute_tokens, "peak_active": r.peak_active,
                     "plan_ms": round(r.plan_ms)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, action="append", help="rollout.n (repeatable; default 32 256 1024)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = [row for n in args.n or [32, 256, 1024] for row in compare(n)]
    print(json.dumps(rows, indent=1) if args.json else format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
