"""The engine protocol: what a decode engine does for the scheduler, and the one loop that drives it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..core.sample import Sample
from ..core.scheduler import Scheduler


class Engine(Protocol):
    def prefill(self, sched: Scheduler, admitted: list[Sample]) -> None:
        """Make admitted samples ready to decode (build a group's prompt KV the first time one of its samples enters,
        rebuild a preempted sample's KV)."""

    def step(self, sched: Scheduler) -> tuple[list[Sample], int]:
        """Decode; return the samples that finished and how many decode steps ran (a real engine runs one)."""

    def release(self, sched: Scheduler, samples: list[Sample]) -> None:
        """Free what retired or preempted samples held (and a group's prompt KV once the scheduler no longer holds it)."""


def check_batch(prompts: Sequence[Sequence[int]], n: int | Sequence[int], prompt_ids: Sequence[str] | None,
                max_new_tokens: int | Sequence[int], max_len: int, limit: str) -> tuple[list[int], list[str]]:
    """A rollout request's group sizes and prompt ids, or a clear error: one n per prompt, no empty prompt, every
    prompt plus its ``max_new_tokens`` (one for all, or one per prompt) within the engine's ``max_len`` (``limit``
    names that limit and its fix)."""
    sizes = [n] * len(prompts) if isinstance(n, int) else list(n)
    if len(sizes) != len(prompts):
        raise ValueError(f"n has {len(sizes)} entries for {len(prompts)} prompts")
    caps = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(caps) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(caps)} entries for {len(prompts)} prompts")
    prompt_ids = [str(i) for i in range(len(prompts))] if prompt_ids is None else [str(p) for p in prompt_ids]
    for i, (p, cap) in enumerate(zip(prompts, caps)):
        if len(p) == 0:
            raise ValueError(f"prompt {prompt_ids[i]!r} is empty: it needs at least one token")
        if len(p) + cap > max_len:
            raise ValueError(f"prompt {prompt_ids[i]!r} has {len(p)} tokens: with max_new_tokens={cap} "
                             f"it exceeds {limit}")
    return sizes, prompt_ids


@dataclass
class Arrivals:
    """Groups that join a running rollout (streaming), given as the rollout's own groups are: prompts, samples per
    prompt, prompt ids, each sample's stream index and each prompt's response cap. ``refuse`` takes the error
    when the engine cannot take them (a prompt too long, a budget too small): they fail alone, the rollout goes on."""

    prompts: list[list[int]]
    n: list[int]
    prompt_ids: list[str]
    stream_indices: list[list[int]]
    max_new_tokens: list[int]
    refuse: Callable[[Exception], None]


@dataclass
class LoopTiming:
    """Where the wall time went: the scheduler's work (its plan, made when it was built, and its bookkeeping in the
    loop) vs the engine's."""

    scheduler_s: float = 0.0
    engine_s: float = 0.0
    steps: int = 0
    plan_s: float = 0.0  # of scheduler_s: the plan, once per rollout

    @property
    def scheduler_share(self) -> float:
        total = self.scheduler_s + self.engine_s
        return self.scheduler_s / total if total else 0.0

    @property
    def step_overhead(self) -> float:
        """The scheduler's bookkeeping per decode step (admit, make room, retire: the plan left out) against the
        engine's time per step."""
        return (self.scheduler_s - self.plan_s) / self.engine_s if self.engine_s else 0.0


def run_rollout(engine: Engine, sched: Scheduler, on_step: Callable[[Scheduler], None] | None = None,
                on_finished: Callable[[list[Sample]], None] | None = None) -> LoopTiming:
    """plan (done by the Scheduler) -> admit -> step -> retire -> refill, until every sample has finished.
    ``on_finished``: the samples that finished at a step, once they are retired (a server answers their requests
    then); ``on_step`` after every step (groups may join the scheduler there: ``Scheduler.add_groups``).

    Any exception inside a step propagates: a rollout never returns partial groups.
    """
    plan_s = sched.stats.plan_ms / 1e3
    timing = LoopTiming(scheduler_s=plan_s, plan_s=plan_s)  # the plan is this rollout's scheduling too
    clock = time.perf_counter
    while not sched.done:
        t0 = clock()
        admitted = sched.admit()
        t1 = clock()
        if admitted:
            engine.prefill(sched, admitted)
        t2 = clock()
        preempted = sched.make_room()
        t3 = clock()
        if preempted:
            engine.release(sched, preempted)
        finished, steps = engine.step(sched)
        t4 = clock()
        sched.step_done(finished, steps)
        t5 = clock()
        if finished:
            engine.release(sched, finished)
        t6 = clock()
        if finished and on_finished is not None:
            on_finished(finished)
        timing.scheduler_s += (t1 - t0) + (t3 - t2) + (t5 - t4)
        timing.engine_s += (t2 - t1) + (t4 - t3) + (t6 - t5)
        timing.steps += steps
        if on_step is not None:
            on_step(sched)
    return timing
