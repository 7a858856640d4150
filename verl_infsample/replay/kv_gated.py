"""A replica behind the KV-peak gate (``core.kv_gate``): its requests wait outside vLLM, in vLLM's own order
(priority, then arrival), and go in while the gate admits them; a probe's rest waits the same way once its probe
ends. vLLM still batches, orders and preempts what it holds.
"""

from __future__ import annotations

import heapq
import itertools

from ..core.capacity import PagedKVBudget
from ..core.kv_gate import GatedRequest, KVPeakGate
from ..core.sample import prompt_key
from .vllm_replica import ReplicaReplay, ReplicaResult, ReplayRequest


def replay_gated(replay: ReplicaReplay, requests: list[ReplayRequest]) -> ReplicaResult:
    """Run ``requests`` (in arrival order) on ``replay`` (built with ``rests_held``) behind a KV-peak gate sized to its
    pool and ``max_num_seqs``."""
    setup = replay.setup
    gate = KVPeakGate(PagedKVBudget(setup.num_blocks - 1, setup.block_size, max_running=setup.max_num_seqs))
    arrival = itertools.count()
    waiting: list = []  # (priority, arrival, request, its gate entry, (sample id, offset) of a rest or None)

    def wait(r: ReplayRequest, entry: GatedRequest, rest_of=None) -> None:
        heapq.heappush(waiting, (r.priority, next(arrival), r, entry, rest_of))

    for r in requests:  # a probe is counted as what it is: its probe tokens
        wait(r, GatedRequest(prompt_key(r.prompt_tokens), len(r.prompt_tokens),
                             r.length if r.rest is not None else r.predicted_len))
    group_of: dict[str, GatedRequest] = {}  # a probe's entry, for its rest
    res = replay.start()
    while True:
        submitted = False
        while waiting and gate.admits(waiting[0][3]):
            submitted = True
            _, _, r, entry, rest_of = heapq.heappop(waiting)
            gate.enter(r.request_id, entry)
            if rest_of is None:
                replay.submit(r)
                if r.rest is not None:
                    group_of[r.rest.request_id] = entry
            else:
                replay.submit_rest(r, *rest_of)
        if not replay.busy:
            if waiting:
                raise RuntimeError("kv gate: nothing runs and the gate admits nothing")  # admits() opens when empty
            break
        before = res.engine_steps
        if not submitted:
            replay.stretch(res)  # what the gate holds waits for a request to end: no step in between changes that
        replay.advance(res, stretch=False)
        gate.tick(res.engine_steps - before)
        for rid in replay.ended:
            gate.leave(rid)
        replay.ended.clear()
        for rest, sample_id, offset in replay.rests_ready:
            probe = group_of.pop(rest.request_id)
            wait(rest, GatedRequest(probe.group_key, probe.prompt_len, rest.predicted_len, generated=offset),
                 (sample_id, offset))
        replay.rests_ready.clear()
    return replay.end(res)
