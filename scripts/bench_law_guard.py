"""What the drafter's law check costs a step: its target probabilities over a real vocabulary (151,936 tokens, Qwen3's),
as it ran before (64 draft positions every step, through vLLM's top-k/top-p) and as it runs now (16 positions one
step in 4, ``spec.law_guard.target_probabilities``), with temperature alone, top-p and top-k. Milliseconds a step on
this machine, medians of ``--repeats``; one JSON line and a table.

    python scripts/bench_law_guard.py [--repeats 5] [--json]
"""

import argparse
import json
import statistics
import time

import torch

from verl_infsample.report import format_table
from verl_infsample.drafter.law_guard import CHECK_EVERY, POSITIONS_PER_STEP, target_probabilities

VOCAB = 151_936
BEFORE_POSITIONS = 64


def vllm_way(logits, temperature, top_k, top_p, tokens):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    logits = logits / temperature.unsqueeze(-1)
    if top_k is not None or top_p is not None:
        logits = apply_top_k_top_p(logits, top_k, top_p)
    return torch.softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def median_ms(fn, positions: int, setting: dict, repeats: int) -> float:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(positions, VOCAB, generator=g)
    temperature = torch.ones(positions)
    top_k = torch.full((positions,), setting["top_k"]) if "top_k" in setting else None
    top_p = torch.full((positions,), setting["top_p"]) if "top_p" in setting else None
    tokens = torch.randint(0, VOCAB, (positions,), generator=g)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(logits.clone(), temperature, top_k, top_p, tokens)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, setting in (("temperature", {}), ("top_p=0.95", {"top_p": 0.95}), ("top_k=50", {"top_k": 50})):
        before = median_ms(vllm_way, BEFORE_POSITIONS, setting, a.repeats)
        after = median_ms(target_probabilities, POSITIONS_PER_STEP, setting, a.repeats) / CHECK_EVERY
        rows.append({"sampling": name, "before_ms_per_step": round(before, 1), "after_ms_per_step": round(after, 1),
                     "after_vs_before": round(after / before, 3)})
    print(json.dumps(rows) if a.json else format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
