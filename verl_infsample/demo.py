"""``make demo``: the main job on the embedded default.

For now (until the verl rollout lands) this is the simulator on the paper's setting: one prompt, G=32 samples,
M=8 slots, lengths drawn like a reasoning model's, and the same batch under a KV budget equal to what 8
worst-case slots would need. It prints the tables and writes a plot of KV memory over time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .cli import main as cli_main
from .core.trace import synth_trace, write_trace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="artifacts", help="where the trace and plots go")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
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
