"""Mean decode steps / lower bound over many seeds (the paper's setting: 1 prompt, G=32, M=8).

Single traces are noisy; this is the comparison the README quotes. Usage: python scripts/sim_seed_sweep.py [--seeds N]
Also counts the seeds whose single trace meets the simulator's goals: ``infinite`` within 8% of the lower bound,
``naive`` at least 1.5x ``infinite``'s steps (``oracle`` within 5%: the oracle row's ``infinite`` column).
"""

import argparse
import json

import numpy as np

from verl_infsample.report import format_table
from verl_infsample.core import SlotPool, synth_trace
from verl_infsample.engines import simulate

POLICIES = ("naive", "continuous", "lpt", "infinite")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    for dist in ("lognormal", "bimodal"):
        for pred in ("noisy:0.3", "noisy:0.1", "oracle"):
            ratios = {pol: [] for pol in POLICIES}
            for seed in range(args.seeds):
                trace = synth_trace(1, 32, 1024, dist, seed)
                for pol in POLICIES:
                    res = simulate(trace, pol, SlotPool(8), pred, seed=seed, max_len=1024)
                    ratios[pol].append(res.decode_steps / res.lower_bound_steps)
            infinite, naive = np.array(ratios["infinite"]), np.array(ratios["naive"])
            rows.append({"dist": dist, "predictor": pred, **{pol: round(float(np.mean(v)), 4) for pol, v in ratios.items()},
                         "seeds_infinite_within_8pct": int((infinite <= 1.08).sum()),
                         "seeds_naive_1.5x_infinite": int((naive >= 1.5 * infinite).sum())})
    cols = ["dist", "predictor", *POLICIES, "seeds_infinite_within_8pct", "seeds_naive_1.5x_infinite"]
    print(json.dumps(rows, indent=1) if args.json else format_table(rows, cols))


if __name__ == "__main__":
    main()
