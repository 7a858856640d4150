"""Drafting rounds: a group's first samples go into vLLM at once, its others wait until one of them has finished, so
they start with a whole sibling answer to draft from (micro sampling groups as drafting rounds). Against it,
``infinite``'s own order sends a group's samples side by side, where running siblings are at the same point."""

from __future__ import annotations

from collections import Counter

from .vllm_replica import ReplicaReplay, ReplicaResult, ReplayRequest


def replay_rounds(replay: ReplicaReplay, requests: list[ReplayRequest], first: int) -> ReplicaResult:
    """Run ``requests`` (in arrival order) on ``replay``, each group's first ``first`` at once and the rest held
    until a sibling has finished (then all of them, in their order)."""
    res = replay.start()
    held: dict[object, list[ReplayRequest]] = {}
    group_of: dict[str, object] = {}
    count: Counter = Counter()
    for r in requests:
        group = r.group or r.prompt_tokens
        sample_id = r.rest.request_id if r.rest is not None else r.request_id
        group_of[sample_id] = group
        if count[group] < first:
            replay.submit(r)
        else:
            held.setdefault(group, []).append(r)
        count[group] += 1
    while replay.busy:
        done = len(res.finished)
        replay.advance(res, stretch=False)
        released = False
        for sample_id, _ in res.finished[done:]:
            for r in held.pop(group_of[sample_id], []):
                replay.submit(r)
                released = True
        if not released:
            replay.stretch(res)
    if held:
        raise RuntimeError(f"drafting rounds: {sum(map(len, held.values()))} samples still held with vLLM empty")
    return replay.end(res)
