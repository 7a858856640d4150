"""A replica whose probes' rests wait in the server's order (``VLLMRequestOrder``: ``hold``, ``release``) and go into
vLLM as it has room, ranked by the predictions as they stand at that moment, as ``rollout.name=infinite`` runs them.

The order runs here, beside the replica, and learns each sample as it finishes (the server's ``finished``), so a
rest released late in the step is ranked by what its siblings and the step's first samples taught the predictor.
"""

from __future__ import annotations

from dataclasses import replace

from ..integration.rollout.vllm_order import OrderedRequest, VLLMRequestOrder
from .vllm_replica import ReplicaReplay, ReplicaResult, ReplayRequest


def replay_held(replay: ReplicaReplay, requests: list[ReplayRequest], order: VLLMRequestOrder,
                ordered: dict[str, OrderedRequest]) -> ReplicaResult:
    """Run ``requests`` (in arrival order) on ``replay`` (built with ``rests_held``); ``ordered``: each sample's
    ``OrderedRequest`` in ``order`` (by its request id), its probe already read (``after_probe``)."""
    res = replay.start()
    for r in requests:
        order.enter()
        replay.submit(r)
    waiting: dict[int, tuple[ReplayRequest, str, int]] = {}  # id of a held OrderedRequest -> (its rest, its sample,
    # the tokens its probe generated)
    submitted = True
    while replay.busy:
        done = len(res.finished)
        if not submitted:
            replay.stretch(res)  # nothing is released before a request ends: no step in between changes that
        replay.advance(res, stretch=False)
        for _ in replay.ended:
            order.leave()
        replay.ended.clear()
        for sample_id, length in res.finished[done:]:
            order.finished(ordered[sample_id], length)
        for rest, sample_id, offset in replay.rests_ready:
            order.hold(ordered[sample_id])
            waiting[id(ordered[sample_id])] = (rest, sample_id, offset)
        replay.rests_ready.clear()
        released = order.release()
        for request in released:
            rest, sample_id, offset = waiting.pop(id(request))
            replay.submit_rest(replace(rest, priority=request.priority), sample_id, offset)
        submitted = bool(released)
    if order.held or waiting:
        raise RuntimeError(f"held rests: {order.held} rests still held with vLLM empty")  # release() opens then
    return replay.end(res)
