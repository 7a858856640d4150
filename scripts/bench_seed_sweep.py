"""Decode steps at M slots over many seeds of ``bench-engine``'s workload, on the real engine's own lengths.

``bench-engine`` runs one seed, and at M=8 its policies' steps differ by where a few long samples land. Per seed this
records the lengths the model generates for the bench's prompts (a ``full`` rollout at the seed, and the earlier
rollout at another seed that warms ``history``, as ``bench-engine`` does), replays them through the scheduler (the
simulator takes the engine's decisions on the same lengths) and reports the steps of ``continuous``, ``infinite``
with ``history``, and ``oracle``, per seed and in total. ``--quantile Q`` adds ``infinite`` planning on the Q quantile
of each prompt's earlier lengths instead of their mean (groups likelier to run long kept out of the tail).

``--kv-share F`` asks for the two M=8 goals together (fewer steps than continuous, at most 20% of full's peak
KV): the same lengths also run under a KV budget of F times ``full``'s peak (the engine's whole blocks:
``full_peak_blocks``) with at most M samples decoding, as ``infinite`` (``history``), ``plain`` and ``oracle``
(``kv:`` columns), and with ``--noise SIGMA`` as ``infinite`` on the true lengths times lognormal(0, SIGMA) errors
(``kv:noisy:SIGMA``): how good predictions must be for both goals at once.

    python scripts/bench_seed_sweep.py [--seeds 12] [--slots 8] [--quantile 0.9] [--kv-share 0.2 --noise 0.05] [--json]
"""

import argparse
import json

import numpy as np

from infsample_lab.bench.engine import recorded_lengths, recorded_trace, warm_on_recorded
from verl_infsample.report import format_table, progress
from verl_infsample.core import KVBudget, SlotPool
from verl_infsample.core.predictor import HistoryPredictor
from verl_infsample.predict import make_predictor
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
    trace = recorded_trace(rec)
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


def full_peak_blocks(rec: dict, block_size: int = 16) -> int:
    """``full``'s peak KV on the engine, in blocks: one group at a time, every sample at once; at the step that feeds
    a sample's t-th token the samples longer than t hold ceil(t / block) blocks each, plus the prompt's."""
    peak = 0
    for prompt_len, lengths in zip(rec["prompt_lens"], rec["this"]):
        prompt = -(-prompt_len // block_size)
        for t in range(max(lengths)):
            peak = max(peak, prompt + sum(n > t for n in lengths) * -(-t // block_size))
    return peak


def replay_under_budget(rec: dict, share: float, slots: int, max_new_tokens: int, noise=(),
                        block_size: int = 16) -> dict[str, int]:
    """Decode steps under a KV budget of ``share`` x ``full``'s peak (whole blocks) with at most ``slots`` samples
    decoding: ``infinite`` (``history``), ``plain``, ``oracle``, and ``infinite`` on noisy true lengths."""
    trace = recorded_trace(rec)
    budget = KVBudget(int(share * full_peak_blocks(rec, block_size)) * block_size, block_size, max_running=slots)
    runs = {"kv:infinite": ("infinite", "history"), "kv:plain": ("plain", "none"), "kv:oracle": ("oracle", "oracle"),
            **{f"kv:noisy:{sigma:g}": ("infinite", f"noisy:{sigma:g}") for sigma in noise}}
    steps = {}
    for name, (policy, spec) in runs.items():
        predictor = make_predictor(spec, max_len=max_new_tokens)
        if isinstance(predictor, HistoryPredictor):
            warm_on_recorded(predictor, rec)
        steps[name] = simulate(trace, policy, budget, predictor, max_len=max_new_tokens).decode_steps
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--quantile", type=float, action="append", default=[])
    p.add_argument("--kv-share", type=float, help="also replay under a KV budget of this share of full's peak, with "
                   "at most --slots samples decoding")
    p.add_argument("--noise", type=float, action="append", default=[],
                   help="with --kv-share: also infinite on the true lengths times lognormal(0, SIGMA) errors")
    p.add_argument("--model", help="HF checkpoint folder (default: the project's tiny model)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.noise and args.kv_share is None:
        p.error("--noise needs --kv-share (it measures predictions under the budget)")
    if args.kv_share is not None and not 0 < args.kv_share <= 1:
        p.error(f"--kv-share must be in (0, 1], got {args.kv_share}")
    rows = []
    for seed in progress(range(args.seeds), "seeds"):
        rec = recorded_lengths(seed, args.prompts, args.group_size, args.max_new_tokens, args.model)
        row = {"seed": seed, **replay(rec, args.slots, args.max_new_tokens, args.quantile)}
        if args.kv_share is not None:
            row.update(replay_under_budget(rec, args.kv_share, args.slots, args.max_new_tokens, args.noise))
        rows.append(row)
    names = [k for k in rows[0] if k != "seed"]
    wins = {k: sum(r[k] < r["continuous"] for r in rows) for k in names}  # the goal: fewer steps than continuous
    rows.append({"seed": "total", **{k: sum(r[k] for r in rows) for k in names}})
    rows.append({"seed": "seeds < continuous", **wins})
    print(json.dumps(rows, indent=1) if args.json else format_table(rows, ["seed", *names]))


if __name__ == "__main__":
    main()
