"""The ``transformers`` backend of the replay: ``custom.engine=transformers``, our own engine, under the same cost
model as the vLLM replicas.

Routing is ``infinite``'s (our router places groups whole). Each replica runs the core scheduler (``infinite``: the
global plan, SJF refill, micro groups under the replica's KV pool as a ``KVBudget`` with ``max_num_seqs`` rows) on
the step-exact simulator, with its server's own history predictor. What a step costs differs from vLLM's: the
engine reads a group's prompt KV once per step for all its running samples (shared-prefix attention), prefills a
group's prompt once in a pass of its own, and rebuilds a preempted sample's KV in passes of ``prefill_chunk``
tokens. Those passes count as engine steps here.
"""

from __future__ import annotations

import math

import numpy as np

from verl_infsample.core.capacity import KVBudget
from verl_infsample.core.predictor import LengthPredictor
from verl_infsample.core.sample import prompt_key
from verl_infsample.core.scheduler import Scheduler
from verl_infsample.core.trace import TracePrompt
from verl_infsample.engines.simulated import SimulatedEngine, simulate
from .hardware import StepCostModel
from .vllm_replica import ReplayRequest, ReplicaResult


class CostedSimulatedEngine(SimulatedEngine):
    """The simulator, charging each stretch of decode steps, each prompt pass and each recompute pass to the cost
    model."""

    def __init__(self, cost: StepCostModel, prefill_chunk: int):
        super().__init__(prefill_chunk)
        self.cost = cost
        self.result = ReplicaResult()
        self._held: set[int] = set()

    def prefill(self, sched: Scheduler, admitted) -> None:
        super().prefill(sched, admitted)
        for s in admitted:
            if s.group not in self._held:  # the group's prompt: one pass, shared by its samples
                self._held.add(s.group)
                self._charge(np.array([s.prompt_len]), np.array([0]), 1, passes=1)
        recompute = sum(s.generated for s in admitted)
        if recompute:
            passes = math.ceil(recompute / self.prefill_chunk)
            self._charge(np.array([min(recompute, self.prefill_chunk)]), np.array([0]), 0, passes=passes)

    def release(self, sched: Scheduler, samples) -> None:
        self._held = {g for g in self._held if sched.holds_prompt(g)}

    def step(self, sched: Scheduler):
        finished, steps = super().step(sched)
        running = sched.running
        generated = np.array([s.generated for s in running], dtype=float)
        prompts = np.array([s.prompt_len for s in running], dtype=float)
        shared = sum({s.group: s.prompt_len for s in running}.values())
        if self.cost is not None:
            self.result.model_s += self.cost.decode_run_seconds(prompts + generated, steps,
                                                                kv_tokens_read=shared + generated.sum())
        self.result.timeline.append((self.result.model_s, len(running)))
        self.result.running_step_sum += steps * len(running)
        self.result.engine_steps += steps
        return finished, steps

    def _charge(self, new, contexts, sampling_rows: int, passes: int) -> None:
        if self.cost is not None:
            self.result.model_s += passes * self.cost.seconds(new, contexts, sampling_rows)
        self.result.engine_steps += passes


def simulate_replica(requests: list[ReplayRequest], predictor: LengthPredictor, cost: StepCostModel,
                     kv_blocks: int, block_size: int, max_num_seqs: int, max_len: int,
                     prefill_chunk: int) -> ReplicaResult:
    """One replica's share of a step on the transformers engine (its groups in the order their first request came)."""
    groups: dict[str, list[ReplayRequest]] = {}
    for r in requests:
        groups.setdefault(prompt_key(r.prompt_tokens), []).append(r)
    trace = [TracePrompt(key, len(reqs[0].prompt_tokens), tuple(r.length for r in reqs)) for key, reqs in groups.items()]
    engine = CostedSimulatedEngine(cost, prefill_chunk)
    capacity = KVBudget((kv_blocks - 1) * block_size, block_size, max_running=max_num_seqs)
    _, sched = simulate(trace, "infinite", capacity, predictor, max_len=max_len, return_scheduler=True,
                        engine=engine)
    res = engine.result
    res.preemptions = sched.stats.preemptions
    res.recomputed_tokens = sched.stats.recompute_tokens
    res.computed_tokens = sum(p.prompt_len for p in trace) + sum(r.length - 1 for r in requests) \
        + sched.stats.recompute_tokens
    res.prefix_hit_tokens = sum(p.prompt_len * (p.group_size - 1) for p in trace)  # read, never recomputed
    res.peak_kv_blocks = -(-sched.stats.peak_kv_tokens // block_size)
    res.finished = [(r.request_id, r.length) for r in requests]
    return res
