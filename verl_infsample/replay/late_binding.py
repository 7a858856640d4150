"""Late binding: a step's requests wait in one queue, in the plan's order, and a replica takes the next one whenever it
has room; only a small buffer waits inside each vLLM, so no replica idles while another holds requests that have
not started.

verl binds every request to a replica the moment it is sent (its router picks the replica with the fewest requests
in flight), so a step ends with its slowest replica, however the lengths fell. Here the replicas advance side by
side in modeled time (the one furthest behind takes the next step), and whenever one of them finishes a sample it is
handed the head of the queue until it holds ``room`` requests again (running or waiting in its vLLM; a probe's rest
stays on the probe's replica, as one request).
"""

from __future__ import annotations

from collections import deque

from .vllm_replica import ReplicaReplay, ReplicaResult, ReplayRequest


def replay_late_bound(replays: list[ReplicaReplay], queue: list[ReplayRequest], room: int) -> list[ReplicaResult]:
    """Run ``queue`` (in the order it is to start) over ``replays``, each holding at most ``room`` requests."""
    if room < 1:
        raise ValueError(f"late binding: room must be >= 1 request per replica, got {room}")
    results = [r.start() for r in replays]
    waiting = deque(queue)
    held = [0] * len(replays)

    def give(i: int) -> None:
        replays[i].submit(waiting.popleft())
        held[i] += 1

    while waiting and min(held) < room:  # the head of the queue dealt round the replicas
        for i in range(len(replays)):
            if waiting and held[i] < room:
                give(i)
    while True:
        busy = [i for i, r in enumerate(replays) if r.busy]
        if not busy:
            break
        i = min(busy, key=lambda j: (results[j].model_s, results[j].engine_steps))
        held[i] -= len(replays[i].advance(results[i]))
        while waiting and held[i] < room:
            give(i)
    return [r.end(res) for r, res in zip(replays, results)]
