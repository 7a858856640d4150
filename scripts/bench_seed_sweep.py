"""Decode steps at M slots over many seeds of ``bench-engine``'s workload, on the real engine's own lengths.

``bench-engine`` runs one seed, and at M=8 its policies' steps differ by where a few long samples land. Per seed this
records the lengths the model generates for the bench's prompts (a ``full`` rollout at the seed, and the earlier
rollout at another seed that warms ``history``, as ``bench-engine`` does), replays them through the scheduler (the
simulator takes the engine's decisions on the same lengths) and reports the steps of ``continuous``, ``infinite``
with ``history``, and ``oracle``, per seed and in total. ``--quantile Q`` adds ``infinite`` planning on the Q quantile
of each prompt's earlier lengths instead of their mean (groups likelier to run long kept out of the tail).

    python scripts/bench_seed_sweep.py [--seeds 12] [--slots 8] [--quantile 0.9] [--json]
"""

import argparse
import json

import numpy as np

from verl_infsample.bench_engine import recorded_lengths, warm_on_recorded
from verl_infsample.cli import _progress, format_table
from verl_infsample.core import SlotPool
from verl_infsample.core.predictor import HistoryPredictor, make_predictor
from verl_infsample.core.trace import TracePrompt
from verl_infsample.engines import simulate


class QuantileHistory(HistoryPredictor):
    """``history`` that predicts the ``q`` quantile of the prompt's kept earlier lengths instead of their mean."""

    def __init__(self, max_len: int, q: float):
        super().__init__(max_len)
        self.q, self.name = q, f"history-q{q:g}"

    def predict(self, group, sample) -> float:
        kept = self._lengths.get(group.prompt_id)
        return float(np.quantile(list(kept), self.q)) if kept else super().predict(group, sample)


def replay(rec: dict, slots: int, max_new_tokens: int, quantiles=()) -> dict[str, int]:
    """Decode steps of each policy on one seed's lengths (``history`` warmed by the earlier rollout's)."""
    trace = [TracePrompt(str(i), n, lengths) for i, (n, lengths) in enumerate(zip(rec["prompt_lens"], rec["this"]))]
    runs = {"continuous": ("continuous", make_predictor("none", max_len=max_new_tokens)),
            "infinite": ("infinite", HistoryPredictor(max_new_tokens)),
            **{f"infinite-q{q:g}": ("infinite", QuantileHistory(max_new_tokens, q)) for q in quantiles},
            "oracle": ("oracle", make_predictor("oracle", max_len=max_new_tokens))}
    steps = {}
    for name, (policy, predictor) in runs.items():
        if isinstance(predictor, HistoryPredictor):
            warm_on_recorded(predictor, rec)
        steps[name] = simulate(trace, policy, SlotPool(slots), predictor, max_len=max_new_tokens).decode_steps
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--quantile", type=float, action="append", default=[])
    p.add_argument("--model", help="HF checkpoint folder (default: the project's tiny model)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    for seed in _progress(range(args.seeds), "seeds"):
        rec = recorded_lengths(seed, args.prompts, args.group_size, args.max_new_tokens, args.model)
        rows.append({"seed": seed, **replay(rec, args.slots, args.max_new_tokens, args.quantile)})
    names = [k for k in rows[0] if k != "seed"]
    rows.append({"seed": "total", **{k: sum(r[k] for r in rows) for k in names}})
    print(json.dumps(rows, indent=1) if args.json else format_table(rows, ["seed", *names]))


if __name__ == "__main__":
    main()
