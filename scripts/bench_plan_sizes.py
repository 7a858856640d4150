"""How long the global plan takes at scale: 1024 prompts x G=64 under M slots, one row per M, and the plan over
replicas x slots (``--replicas R``: 1024 prompts x G=16 over R x 1024 lanes, one FPTAS call).

The plan (``infinite``: the FPTAS over chunks of groups, on ``--predictor``'s predictions, ``noisy:0.3`` by default) is what a rollout pays before
its first decode step; ``plan_ms`` is the simulator's measure of it (predictions excluded), ``fptas_eps`` the
guarantee the plan reports (its largest over chunks: ``eps`` when the search completed, else the a-posteriori
ratio to the lower bound). Plan times are this machine's and noisy.

    python scripts/bench_plan_sizes.py [--prompts 1024] [--group-size 64] [--slots 8,16,...,1024]
        [--replicas 8] [--predictor noisy:0.3] [--seed 0] [--json]
"""

import argparse
import json
import time

import numpy as np

from verl_infsample.report import format_table, progress
from verl_infsample.core import SlotPool, fptas_schedule, synth_trace
from verl_infsample.engines import simulate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=1024)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--slots", default="8,16,32,64,128,256,512,1024")
    p.add_argument("--replicas", type=int, default=8, help="the replicas x slots row: R x 1024 lanes (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--predictor", default="noisy:0.3", help="what the plan is made on: noisy:SIGMA, oracle, ...")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    trace = synth_trace(args.prompts, args.group_size, 1024, "lognormal", args.seed)
    rows = []
    for m in progress([int(x) for x in args.slots.split(",")], "plan sizes"):
        res = simulate(trace, "infinite", SlotPool(m), args.predictor, max_len=1024, seed=args.seed)
        rows.append({"slots": m, "samples": res.samples, "plan_ms": res.plan_ms, "decode_steps": res.decode_steps,
                     "steps_vs_bound": res.steps_vs_bound, "plan_method": res.plan.get("plan_method"),
                     "eps_guaranteed": round(res.plan.get("plan_eps_guaranteed", float("nan")), 4)})
    if args.replicas:
        rows.append(_replicas_row(args))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows, ["slots", "samples", "plan_ms", "decode_steps", "steps_vs_bound", "plan_method",
                                  "eps_guaranteed"]))
    return 0


def _replicas_row(args) -> dict:
    """One plan of every sample of 1024 prompts x G=16 over replicas x 1024 lanes, on noisy predictions of the
    trace's lengths (log-error 0.3), timed around the FPTAS call."""
    trace = synth_trace(args.prompts, 16, 1024, "lognormal", args.seed)
    lengths = np.array([n for p in trace for n in p.lengths], dtype=float)
    predicted = lengths * np.exp(0.3 * np.random.default_rng(args.seed).standard_normal(len(lengths)))
    lanes = args.replicas * 1024
    t = time.perf_counter()
    plan = fptas_schedule(predicted, lanes, 0.02)
    ms = (time.perf_counter() - t) * 1e3
    return {"slots": f"{args.replicas}x1024", "samples": len(lengths), "plan_ms": round(ms, 3), "decode_steps": None,
            "steps_vs_bound": None, "plan_method": plan.method, "eps_guaranteed": round(plan.eps_guaranteed, 4)}


if __name__ == "__main__":
    raise SystemExit(main())
