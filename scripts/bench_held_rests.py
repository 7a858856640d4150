"""What re-ranking held rests costs the server: a step's rests held in ``VLLMRequestOrder`` (the learned predictor,
trained on earlier steps), then released one for each sample that finishes, as a full vLLM frees one slot at a
time. Prints the first release (every held rest re-predicted: the predictor re-fit on the step before) and every
release after it, in milliseconds, as JSON.

    python scripts/bench_held_rests.py [--groups 128] [--n 16] [--probe-tokens 16] [--max-len 16384]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from verl_infsample.integration.rollout.vllm.order import VLLMRequestOrder
from verl_infsample.predict import make_predictor
from verl_infsample.predict.features import TokenWindow


def probed_step(order: VLLMRequestOrder, rng: random.Random, groups: int, n: int, k: int, max_len: int):
    """A step's samples, each arrived and probed (its opening read)."""
    order.new_step()
    requests = []
    for _ in range(groups):
        prompt = [rng.randrange(1000) for _ in range(64)]
        for _ in range(n):
            r = order.arrive(prompt, group_size=n, max_tokens=max_len)
            order.after_probe(r, TokenWindow([rng.randrange(50) for _ in range(k)]))
            requests.append(r)
    return requests


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=128)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--probe-tokens", type=int, default=16)
    p.add_argument("--max-len", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    k = args.probe_tokens
    order = VLLMRequestOrder("longest_first", make_predictor(f"learned:k={k}", max_len=args.max_len), room=1)
    for _ in range(3):  # earlier steps: the predictor trained
        for r in probed_step(order, rng, args.groups, args.n, k, args.max_len):
            order.finished(r, rng.randrange(k + 1, args.max_len))
    requests = probed_step(order, rng, args.groups, args.n, k, args.max_len)
    order.enter()  # vLLM full: every rest is held
    for r in requests:
        order.hold(r)
    order.leave()
    t = time.perf_counter()
    inside = order.release()
    first_ms = (time.perf_counter() - t) * 1e3
    released, times = len(inside), []
    while inside:
        done = inside.pop()
        order.leave()
        order.finished(done, rng.randrange(k + 1, args.max_len))
        t = time.perf_counter()
        more = order.release()
        times.append((time.perf_counter() - t) * 1e3)
        inside += more
        released += len(more)
    times.sort()
    print(json.dumps({"held": len(requests), "released": released, "first_release_ms": round(first_ms, 2),
                      "releases": len(times), "release_ms_total": round(sum(times), 1),
                      "release_ms_median": round(times[len(times) // 2], 3) if times else 0.0,
                      "release_ms_max": round(times[-1], 2) if times else 0.0}))


if __name__ == "__main__":
    main()
