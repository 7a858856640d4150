"""A step-exact simulator: replays known response lengths through the real scheduler.

It jumps from one event to the next (a sample finishing, the KV budget filling up, or a planned start the policy
waits for), which is exact because otherwise nothing can be admitted between two retirements: capacity frees
when a sample retires.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

from ..core.capacity import Capacity, KVBudget, SampleArrays
from ..core.predictor import LengthPredictor
from ..core.sample import Group, Sample
from ..core.scheduler import Scheduler, SchedulerStats, build_scheduler
from ..core.trace import TracePrompt
from ..predict.factory import as_predictor
from .base import run_rollout


class SimulatedEngine:
    """``prefill_chunk``: tokens one forward pass can prefill. Rebuilding a preempted sample's KV stalls the batch
    for ceil(tokens / prefill_chunk) passes, charged to ``decode_steps`` (a group's first prompt prefill is not
    charged: every policy pays it alike)."""

    def __init__(self, prefill_chunk: int = 2048):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = prefill_chunk

    def prefill(self, sched: Scheduler, admitted: list[Sample]) -> None:
        recompute = sum(s.generated for s in admitted)
        if recompute:
            sched.charge_recompute(-(-recompute // self.prefill_chunk))

    def release(self, sched: Scheduler, samples: list[Sample]) -> None:
        pass

    def step(self, sched: Scheduler) -> tuple[list[Sample], int]:
        running = sched.running
        steps = min(s.true_len - s.generated for s in running)
        if sched.enforced.charges_kv:
            steps = _steps_until_full(sched.enforced, running, steps)
        wake = sched.policy.wake_at(sched.stats.decode_steps)
        if wake is not None:  # a planned start comes before the next retirement
            steps = min(steps, wake - sched.stats.decode_steps)
        finished = [s for s in running if s.generated + steps >= s.true_len]
        return finished, steps


def _steps_until_full(budget: KVBudget, running: list[Sample], steps: int) -> int:
    """Steps that may run before the scheduler must look again: the first j (1 <= j <= ``steps``) after which the
    next step would outgrow the budget (where it must preempt), found by bisection (KV only grows between
    retirements), else ``steps``."""
    arrays = SampleArrays.of(running)
    if budget.in_use(arrays, steps) <= budget.limit:
        return steps
    lo, hi = 0, steps  # in_use(lo) fits (the scheduler made room for the next step), in_use(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if budget.in_use(arrays, mid) <= budget.limit else (lo, mid)
    return hi


class ReplayEngine(SimulatedEngine):
    """Replays a trace's tokens for a predictor that reads them: it jumps between events like ``SimulatedEngine``,
    the next event also being a running sample reaching one of ``Scheduler.token_checkpoints``, where it reports the
    sample's tokens as a live engine would (a ``TokenWindow`` from the trace's ``tokens`` and, where present,
    ``logprobs``/``entropies``/``stop_logprobs``)."""

    def __init__(self, trace: list[TracePrompt], prefill_chunk: int = 2048):
        super().__init__(prefill_chunk)
        missing = [p.prompt_id for p in trace if p.tokens is None]
        if missing:
            raise ValueError(f"trace prompt {missing[0]!r} has no 'tokens': a token-conditioned replay needs the "
                             "generated ids of every sample (see core/trace.py)")
        self.trace = trace

    def window(self, s: Sample, n: int):
        """Sample ``s``'s first ``n`` tokens from the trace, as a live engine reports them (a ``TokenWindow``)."""
        from ..predict.features import TokenWindow

        p, i = self.trace[s.group], s.index
        return TokenWindow(p.tokens[i][:n], None if p.logprobs is None else p.logprobs[i][:n],
                           math.nan if p.entropies is None else p.entropies[i][n - 1],
                           math.nan if p.stop_logprobs is None else p.stop_logprobs[i][n - 1])

    def first_tokens(self, samples: list[Sample]) -> list:
        """The first-token lookahead (``Scheduler(first_tokens=...)``): each sample's first token from the trace."""
        return [self.window(s, 1) for s in samples]

    def step(self, sched: Scheduler) -> tuple[list[Sample], int]:
        finished, steps = super().step(sched)
        ahead = [c - s.generated for s in sched.running for c in sched.token_checkpoints
                 if 0 < c - s.generated <= steps and c <= s.true_len]
        if ahead and min(ahead) < steps:  # stop at the earliest checkpoint instead
            steps = min(ahead)
            finished = [s for s in sched.running if s.generated + steps >= s.true_len]
        reports = [(s, self.window(s, s.generated + steps)) for s in sched.running
                   if s.generated + steps in sched.token_checkpoints and s.generated + steps <= s.true_len]
        if reports:
            sched.observe_tokens(reports)
        return finished, steps


@dataclass
class SimulationResult:
    policy: str
    predictor: str
    capacity: str
    decode_steps: int
    lower_bound_steps: int
    steps_vs_bound: float
    peak_active: int
    peak_kv_tokens: int
    preemptions: int
    recompute_tokens: int
    recompute_steps: int
    prefill_passes: int
    plan_ms: float
    predict_ms: float
    total_tokens: int
    samples: int
    plan: dict

    def as_dict(self) -> dict:
        return asdict(self)


def simulate(trace: list[TracePrompt], policy: str, capacity: Capacity, predictor: str | LengthPredictor = "none",
             *, max_len: int | None = None, seed: int = 0, fptas_eps: float = 0.02, prefill_chunk: int = 2048,
             return_scheduler: bool = False, on_step: Callable[[Scheduler], None] | None = None,
             engine: SimulatedEngine | None = None):
    """Run one policy over a trace on the simulator; returns a ``SimulationResult`` (and the scheduler if asked).
    ``engine``: a ``SimulatedEngine`` that also accounts for what its steps cost (``infsample replay``).

    A predictor that reads tokens (``learned``) gets the trace's prompt and generated tokens (``ReplayEngine``)
    when the trace has them."""
    longest = max(max(p.lengths) for p in trace)
    max_len = longest if max_len is None else max_len
    if longest > max_len:
        raise ValueError(f"max_len={max_len} is shorter than the longest sample in the trace ({longest}): raise "
                         f"max_len (--max-len) to at least {longest}, or leave it unset to use the trace's longest")
    groups = [Group(p.prompt_id, p.prompt_len, p.group_size) for p in trace]
    replay = ReplayEngine(trace, prefill_chunk) if all(p.tokens is not None for p in trace) else None
    sched = build_scheduler(groups, policy, capacity, as_predictor(predictor, seed=seed, max_len=max_len), max_len,
                            fptas_eps=fptas_eps,
                            true_lengths=[list(p.lengths) for p in trace],
                            prompt_tokens=[p.prompt_tokens for p in trace],
                            first_tokens=replay.first_tokens if replay else None)
    pol, pred = sched.policy, sched.predictor
    if replay is not None and sched.refines_predictions:
        engine = replay
    elif engine is None:
        engine = SimulatedEngine(prefill_chunk)
    run_rollout(engine, sched, on_step=on_step)
    st: SchedulerStats = sched.stats
    bound = _lower_bound_steps(trace, sched.enforced)
    result = SimulationResult(
        policy=policy, predictor=pred.name, capacity=str(capacity),
        decode_steps=st.decode_steps, lower_bound_steps=bound, steps_vs_bound=round(st.decode_steps / bound, 4),
        peak_active=st.peak_active, peak_kv_tokens=st.peak_kv_tokens, preemptions=st.preemptions,
        recompute_tokens=st.recompute_tokens,
        recompute_steps=st.recompute_steps, prefill_passes=st.prefill_passes, plan_ms=round(st.plan_ms, 3),
        predict_ms=round(st.predict_ms, 3),
        total_tokens=st.total_tokens, samples=len(sched.samples), plan=pol.plan_info)
    return (result, sched) if return_scheduler else result


def _lower_bound_steps(trace: list[TracePrompt], capacity: Capacity) -> int:
    """No schedule finishes sooner.

    Slots: max(longest sample, ceil(total tokens / M)). KV budget: every step holds at most ``budget`` tokens,
    while a sample of length l holds 1, 2, ..., l tokens over its l steps and a group's prompt is held at least as
    long as its longest sample, so steps >= (sum of l(l+1)/2 + sum of prompt * longest in group) / budget.
    """
    lengths = [n for p in trace for n in p.lengths]
    longest = max(lengths)
    if capacity.slots is None and not capacity.charges_kv:  # unbounded: whole groups at once
        return int(max(longest, math.ceil(sum(lengths) / max(p.group_size for p in trace))))
    if capacity.slots is not None:
        return int(max(longest, math.ceil(sum(lengths) / capacity.slots)))
    area = sum(n * (n + 1) // 2 for n in lengths) + sum(p.prompt_len * max(p.lengths) for p in trace)
    return int(max(longest, math.ceil(area / capacity.tokens)))
