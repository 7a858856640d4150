"""How long the global plan takes at scale: 1024 prompts x G=64 under M slots, one row per M.

The plan (``infinite``: the FPTAS over chunks of groups, on ``--predictor``'s predictions, ``noisy:0.3`` by default) is what a rollout pays before
its first decode step; ``plan_ms`` is the simulator's measure of it (predictions excluded), ``fptas_eps`` the
guarantee the plan reports (its largest over chunks: ``eps`` when the search completed, else the a-posteriori
ratio to the lower bound). Plan times are this machine's and noisy.

    python scripts/bench_plan_sizes.py [--prompts 1024] [--group-size 64] [--slots 8,16,32,64,128,256]
        [--predictor noisy:0.3] [--seed 0] [--json]
"""

import argparse
import json

from verl_infsample.bench.report import format_table, progress
from verl_infsample.core import SlotPool, synth_trace
from verl_infsample.engines import simulate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=1024)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--slots", default="8,16,32,64,128,256")
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
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows, ["slots", "samples", "plan_ms", "decode_steps", "steps_vs_bound", "plan_method",
                                  "eps_guaranteed"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
