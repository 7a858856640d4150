"""The engine protocol: what a decode engine does for the scheduler, and the one loop that drives it."""

from __future__ import annotations

from typing import Callable, Protocol

from ..core.sample import Sample
from ..core.scheduler import Scheduler


class Engine(Protocol):
    def prefill(self, sched: Scheduler, admitted: list[Sample]) -> None:
        """Make admitted samples ready to decode (build a group's prompt KV the first time one of its samples enters)."""

    def evict(self, sched: Scheduler, preempted: list[Sample]) -> None:
        """Drop the KV of preempted samples (their tokens are kept; the KV is rebuilt when they are readmitted)."""

    def step(self, sched: Scheduler) -> tuple[list[Sample], int]:
        """Decode; return the samples that finished and how many decode steps ran (a real engine runs one)."""


def run_rollout(engine: Engine, sched: Scheduler, on_step: Callable[[Scheduler], None] | None = None) -> Scheduler:
    """plan (done by the Scheduler) -> admit -> step -> retire -> refill, until every sample has finished.

    Any exception inside a step propagates: a rollout never returns partial groups.
    """
    while not sched.done:
        admitted = sched.admit()
        if admitted:
            engine.prefill(sched, admitted)
        preempted = sched.make_room()
        if preempted:
            engine.evict(sched, preempted)
        finished, steps = engine.step(sched)
        sched.step_done(finished, steps)
        if on_step is not None:
            on_step(sched)
    return sched
