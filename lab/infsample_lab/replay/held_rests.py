"""A replica whose probes' rests wait in the server's order (``VLLMRequestOrder``: ``hold``, ``release``) and go into
vLLM as it has room, ranked by the predictions as they stand at that moment, as ``rollout.name=infinite`` runs them.

The order runs here, beside the replica, and learns each sample as it finishes (the server's ``finished``), so a
rest released late in the step is ranked by what its siblings and the step's first samples taught the predictor.

Longest predicted first is list scheduling in LPT order, the FPTAS's first step (``core.fptas``), which is the plan
itself wherever LPT comes within ``PLAN_EPS`` of the lower bound. The replay checks the held order against the plan
at every ``PLAN_CHECK_EVERY``-th release where more rests wait than vLLM runs at once (the released ones included,
planned over ``max_num_seqs`` slots on the predictions as they stand then): ``order_vs_plan`` is the worst ratio of
LPT's planned makespan to the FPTAS plan's (1.0: the held order is the plan's).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from verl_infsample.core.fptas import fptas_schedule, lpt_schedule
from verl_infsample.integration.rollout.vllm.order import OrderedRequest, VLLMRequestOrder
from .vllm_replica import ReplicaReplay, ReplicaResult, ReplayRequest

PLAN_EPS = 0.02  # the FPTAS's eps: the plan is within it of the optimum
PLAN_CHECK_EVERY = 8  # releases between two checks of the held order against the plan


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
    submitted, releases, lanes = True, 0, replay.setup.max_num_seqs
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
        if released and order.held + len(released) > lanes and (releases := releases + 1) % PLAN_CHECK_EVERY == 0:
            check_plan([*order.held_remaining(), *(r.sample.remaining_predicted() for r in released)], lanes, res)
        for request in released:
            rest, sample_id, offset = waiting.pop(id(request))
            # as the server sends it: at its rank and prediction as they stand at its release
            replay.submit_rest(replace(rest, priority=request.priority, predicted_len=request.sample.predicted_len),
                               sample_id, offset)
        submitted = bool(released)
    if order.held or waiting:
        raise RuntimeError(f"held rests: {order.held} rests still held with vLLM empty")  # release() opens then
    return replay.end(res)


def check_plan(remaining: list[float], lanes: int, res: ReplicaResult) -> None:
    """Count a check of the held rests (their ``remaining`` predicted tokens, as ranked at a release), longest
    first against the FPTAS plan over ``lanes`` slots."""
    remaining = np.array(remaining, dtype=float)
    plan = fptas_schedule(remaining, lanes, PLAN_EPS)
    res.plan_checks += 1
    res.order_vs_plan = max(res.order_vs_plan, lpt_schedule(remaining, lanes).makespan / plan.makespan)
