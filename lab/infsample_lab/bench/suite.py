"""``make bench``: the engine benchmark and the simulator on the paper's settings.

1. ``infsample bench-engine`` on the project's tiny Qwen3 checkpoint (built offline on first use): 4 prompts,
   G=64 samples each, M=8 slots, 128 new tokens; every policy on the real engine next to HF ``generate``, each
   row its fastest of ``--repeat`` rounds;
2. the simulator on the paper's setting (1 prompt, G=32, M=8) and on a 64-prompt batch, under M slots and under a
   KV budget equal to what M worst-case slots would need.

It prints the tables and writes plots of KV memory over time to ``artifacts/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_infsample.cli import main as cli_main
from verl_infsample.core.trace import synth_trace, write_trace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="artifacts", help="where the trace and plots go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="bench-engine rounds (each row keeps its fastest)")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print("== the real engine: 4 prompts x G=64, M=8 slots, 128 new tokens (tiny Qwen3, CPU)")
    rc = cli_main(["bench-engine", "--prompts", "4", "--group-size", "64", "--slots", "8", "--max-new-tokens", "128",
                   "--seed", str(args.seed), "--repeat", str(args.repeat), "--plot", str(out / "bench_engine_kv.png")])
    if rc:
        return rc
    max_len = 1024
    for name, prompts, group_size, slots in (("paper", 1, 32, 8), ("batch", 64, 64, 16)):
        trace = synth_trace(prompts, group_size, max_len, "lognormal", args.seed)
        path = out / f"trace_{name}.jsonl"
        write_trace(trace, path)
        budget = slots * (max(t.prompt_len for t in trace) + max_len)
        for flag, value in (("--slots", slots), ("--kv-budget", budget)):
            title = f"{prompts} prompt(s) x G={group_size}, {flag.lstrip('-')}={value}, predictor noisy:0.3"
            print(f"\n== {title}")
            plot = out / f"kv_{name}_{flag.strip('-').replace('-', '_')}.png"
            rc = cli_main(["simulate", "--trace", str(path), flag, str(value), "--max-len", str(max_len),
                           "--seed", str(args.seed), "--plot", str(plot)])
            if rc:
                return rc
    print(f"\nplots of KV memory over decode steps are in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
