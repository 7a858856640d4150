#!/usr/bin/env python
"""Reproduces the README's learned-predictor table: ``infsample eval-predictor --tiny VARIANT --k 8
--ceiling 24 --json`` on several seeds, one table row per figure, and the JSON lines under OUT.

    .venv/bin/python scripts/predictor_figures.py [--variant modes] [--seeds 0-5] [--out artifacts/predictor]
        [--kv-budget 2000] [--predictor learned:k=8,q=0.8] [--ceiling 0] [EVAL-PREDICTOR FLAGS...]

Flags it does not know go to ``infsample eval-predictor`` as they are (``--train-rollouts 1 --test-prompts 2``: a
smoke run at tiny sizes).

About 1.5 minutes per seed on one core (the rollouts, the replay, a cost rollout and the Monte Carlo ceiling).
Run it on an otherwise idle machine: the cost column is a share of wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def seeds(spec: str) -> list[int]:
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="modes", choices=["default", "modes", "modes-quick"])
    ap.add_argument("--seeds", default="0-5", help="a seed or a range, e.g. 0-5")
    ap.add_argument("--ceiling", type=int, default=24, help="continuations per sample for the ceiling (0: off)")
    ap.add_argument("--kv-budget", type=int, default=None, help="run under a KV budget of this many tokens")
    ap.add_argument("--predictor", default=None, help="the spec under test (default learned:k=8)")
    ap.add_argument("--out", default="artifacts/predictor")
    args, passthrough = ap.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    infsample = Path(sys.executable).parent / "infsample"
    rows = []
    for s in seeds(args.seeds):
        cmd = [str(infsample), "eval-predictor", "--tiny", args.variant, "--k", "8", "--json", "--seed", str(s),
               "--ceiling", str(args.ceiling)]
        cmd += ["--kv-budget", str(args.kv_budget)] if args.kv_budget is not None else []
        cmd += ["--predictor", args.predictor] if args.predictor else []
        cmd += passthrough
        print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    name = args.variant + (f"_kv{args.kv_budget}" if args.kv_budget is not None else "")
    (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cells = {
        "decode steps vs `oracle`: learned / `history`":
            lambda d: f"{d['steps_vs_oracle']:.3f} / {d['history_steps_vs_oracle']:.3f}",
        "steps / preemptions: learned, `history`, `oracle`": lambda d: ", ".join(
            f"{d['decode_steps'][n]} / {d['preemptions'][n]}" for n in ("learned", "history", "oracle")),
        "predictor cost per decode step": lambda d: f"{100 * d['cost']['predictor_share']:.2f}%",
        "Kendall tau at k=8 (`history`: 0)": lambda d: f"{d['kendall_tau']:.3f}",
        "ceiling tau at k=8 (Monte Carlo)":
            lambda d: "-" if d["ceiling_kendall_tau"] is None else f"{d['ceiling_kendall_tau']:.3f}",
        "MAE, tokens: learned / `history`": lambda d: f"{d['mae']:.1f} / {d['history_mae']:.1f}",
    }
    print(f"{rows[0]['predictor']} under {rows[0]['capacity']}")
    print("| seed | " + " | ".join(str(s) for s in seeds(args.seeds)) + " |")
    print("|---|" + "---|" * len(rows))
    for label, cell in cells.items():
        print(f"| {label} | " + " | ".join(cell(d) for d in rows) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
