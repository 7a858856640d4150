"""Admission policies: which waiting sample enters a free slot (or free KV) next.

Every policy sees the same thing: the batch's samples once (``plan``), then, whenever capacity frees up, a
``fits`` test, and answers with the sample to admit now or ``None`` (wait). The scheduler does the bookkeeping.

=============  ==========================================================================================
``full``       a whole group decodes at once, groups one after another (plain GRPO: the memory baseline)
``naive``      micro sampling groups: rounds of at most M samples of one group; a round starts when the
               previous round's longest sample has ended
``continuous`` a freed slot is refilled at once, first come first served, across groups
``lpt``        continuous refill, longest predicted sample first (a strong makespan heuristic)
``infinite``   with M slots: the global FPTAS plan over predicted lengths (see ``fptas``), admitted in
               planned start order; groups are planned together in chunks whose prompts stay within
               ``OPEN_PROMPT_SHARE`` of the lanes' KV (all of a small batch). Under a KV budget: the
               memory-skyline plan (see ``skyline``), each sample at its planned step, keeping the
               planned gaps; a sample that ends before the next planned start may go first (backfill; it
               then leaves the plan, which stops counting it at its planned steps). Batches too big for
               the skyline: groups kept together, longest first, and when the next sample does not fit
               the free KV, the shortest waiting sample that does goes first (SJF refill)
``oracle``     ``infinite`` with the true lengths: what a perfect predictor would buy
``plain``      what verl does without us: every request at once, first come first served; under a KV
               budget a sample enters when the next step's KV fits *now* (no reservation for its growth),
               and the engine preempts the latest admitted when decoding outgrows the budget (vLLM's way)
=============  ==========================================================================================
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

import numpy as np

from .admission import Fits, PlannedOrderAdmission, SkylinePacedAdmission
from .capacity import Capacity, Ledger, Unbounded
from .fptas import fptas_schedule
from .predictor import LengthPredictor, OraclePredictor, WorstCasePredictor
from .sample import Sample, SampleState
from .skyline import Footprints, plan_skyline


class Policy:
    """A policy answers what it plans on (``predictor_for``), which capacity it keeps to (``enforced``) and how a
    sample is judged to fit (``admission_rule``), then orders and admits (``plan``, ``select``)."""

    name: str = ""

    def predictor_for(self, predictor: LengthPredictor) -> LengthPredictor:
        """The predictor this policy plans on, given the rollout's: a baseline plans every sample at its cap."""
        return WorstCasePredictor()

    def enforced(self, capacity: Capacity) -> Capacity:
        """The capacity this policy keeps to (checked at start, admitted against, preempted for)."""
        return capacity

    def admission_rule(self, capacity: Capacity) -> Callable[[Sample, Ledger], bool]:
        """Whether a sample may start now: its growth to its predicted length reserved."""
        return capacity.admits

    def plan(self, samples: list[Sample], lanes: int, memory: Footprints | None = None) -> None:
        """Called once with every sample of the batch, in (group, index) order.

        ``lanes``: how many samples decode at once (M, or what a KV budget holds on average).
        ``memory``: the KV budget when memory, not a slot count, binds (every group in flight holds its prompt).
        """
        self.queue = deque(samples)

    def extend(self, samples: list[Sample], lanes: int, *, busy: list[float], memory: Footprints | None = None) -> None:
        """``samples`` (of groups that joined the running batch, in (group, index) order) enter the plan. ``busy``:
        the running samples' predicted remaining tokens (the lanes they hold, and until when). Here: after those
        already waiting."""
        self.queue.extend(samples)

    def select(self, fits: Fits, now: int) -> Sample | None:
        """The sample to admit at decode step ``now``, or None to admit nothing more for now."""
        if self.queue and fits(self.queue[0]):
            return self.queue.popleft()
        return None

    def select_when_idle(self, fits: Fits, now: int) -> Sample | None:
        """The sample to start at decode step ``now`` when nothing runs and ``select`` chose none: a plan's timing
        may hold a sample back while others run, never while the engine idles. Any sample fits an empty engine
        (``Capacity.check_fits``), so the scheduler never stalls."""
        return self.select(fits, now)

    def wake_at(self, now: int) -> int | None:
        """A later step at which ``select`` may admit even if nothing retires before (a planned start), or None."""
        return None

    def on_retire(self, sample: Sample) -> None:
        pass

    def requeue(self, sample: Sample) -> None:
        """A preempted sample goes back to the head of the line (it has waited longest)."""
        self.queue.appendleft(sample)

    def predictions_changed(self, waiting: list[Sample]) -> None:
        """These waiting samples' ``predicted_len`` changed (a refining predictor); the plan itself stays."""

    @property
    def plan_info(self) -> dict:
        return {}


class ContinuousPolicy(Policy):
    name = "continuous"


class PlainSubmissionPolicy(Policy):
    """verl's own path, as a baseline the simulator can run at any scale: all requests queued at once, admitted
    while the next step fits, preempted (latest first, back to the head of the line) when the KV runs out."""

    name = "plain"

    def admission_rule(self, capacity: Capacity) -> Callable[[Sample, Ledger], bool]:
        """Admitted while the next step fits, no reservation for growth (the engine preempts when it outgrows)."""
        return capacity.fits_now


class PredictivePolicy(Policy):
    """A policy that plans on the rollout's predictor."""

    def predictor_for(self, predictor: LengthPredictor) -> LengthPredictor:
        return predictor


class LongestPredictedFirstPolicy(PredictivePolicy):
    name = "lpt"

    def plan(self, samples: list[Sample], lanes: int, memory: Footprints | None = None) -> None:
        self.queue = deque(sorted(samples, key=lambda s: (-s.predicted_len, s.uid)))

    def extend(self, samples: list[Sample], lanes: int, *, busy: list[float], memory: Footprints | None = None) -> None:
        self.plan([*waiting_in(self.queue), *samples], lanes, memory)


class MicroGroupPolicy(Policy):
    """Rounds of at most ``round_size`` samples of one group; the next round waits for the whole round to end."""

    name = "naive"

    def __init__(self, round_size: int | None = None):
        self.round_size = round_size
        self.in_flight = 0
        self.admitted_in_round = 0
        self.round_open = True
        self.round_group = -1

    def select(self, fits: Fits, now: int) -> Sample | None:
        if not self.round_open:
            if self.in_flight:
                return None
            self.round_open, self.admitted_in_round = True, 0
        if not self.queue:
            return None
        head = self.queue[0]
        full_round = self.round_size is not None and self.admitted_in_round >= self.round_size
        other_group = self.admitted_in_round > 0 and head.group != self.round_group
        if full_round or other_group or not fits(head):
            self.round_open = self.admitted_in_round == 0  # a round that admitted nothing stays open
            return None
        self.admitted_in_round += 1
        self.in_flight += 1
        self.round_group = head.group
        return self.queue.popleft()

    def on_retire(self, sample: Sample) -> None:
        self.in_flight -= 1

    def requeue(self, sample: Sample) -> None:
        self.in_flight -= 1
        super().requeue(sample)


class FullGroupPolicy(MicroGroupPolicy):
    name = "full"

    def enforced(self, capacity: Capacity) -> Capacity:
        """Whole groups at once, whatever the capacity says (the baseline that shows what memory caps)."""
        return Unbounded()

    def __init__(self):
        super().__init__(round_size=None)


OPEN_PROMPT_SHARE = 0.25  # under M slots: the prompts of a plan chunk's groups, against the lanes' KV at its fullest


def open_prompt_allowance(lanes: int, longest: float) -> float:
    """Prompt tokens that may be held at once under M slots: ``OPEN_PROMPT_SHARE`` of ``lanes`` samples' KV at
    ``longest`` tokens each (the plan's chunks; the engine's first-token lookahead keeps its prompt KV within it)."""
    return OPEN_PROMPT_SHARE * lanes * longest


def chunk_groups(groups: list[int], prompt_lens: list[int], allowance: float) -> list[list[int]]:
    """``groups`` in order, cut into consecutive chunks whose prompt tokens stay within ``allowance`` (a chunk has
    at least one group)."""
    chunks: list[list[int]] = []
    held = math.inf
    for g, p in zip(groups, prompt_lens):
        if held + p > allowance:
            chunks.append([])
            held = 0
        chunks[-1].append(g)
        held += p
    return chunks


class InfiniteSamplingPolicy(PredictivePolicy):
    """Global plan (FPTAS over M slots; memory skyline under a KV budget), admitted by the rule that fits the plan
    (``core/admission.py``): planned order with SJF refill of what the planned head cannot use, or, with a skyline
    plan, its planned starts with backfill of samples that end before the head's."""

    name = "infinite"

    def __init__(self, fptas_eps: float = 0.02):
        self.fptas_eps = fptas_eps
        self._info: dict = {}

    def plan(self, samples: list[Sample], lanes: int, memory: Footprints | None = None) -> None:
        """Under M slots: the FPTAS plan (planned start order, longest first at equal starts) over chunks of groups,
        each chunk on the lanes as the chunks before it leave them (a lane frees when its last planned sample ends),
        so a chunk boundary leaves no lane idle the plan did not account for. Within a chunk the samples of its groups
        interleave, so a predictor that tells
        samples apart (``learned`` with the first-token lookahead) gets its long samples started first wherever
        they are and its short ones kept for the tail, where the lanes must end together. A group holds its
        prompt's KV from its first start to its last end, so a chunk is as many groups, longest predicted first,
        as keep their prompts within ``OPEN_PROMPT_SHARE`` of what the lanes hold at their fullest (one chunk
        for small batches; B=1 as in the paper: the one group). Under a KV budget: the skyline plan, or for
        batches too big for it, longest first throughout, groups kept together (it packs the budget)."""
        self._plan(samples, lanes, memory, np.zeros(lanes), skyline=True)

    def extend(self, samples: list[Sample], lanes: int, *, busy: list[float], memory: Footprints | None = None) -> None:
        """The groups that joined are planned with every sample still waiting: under M slots the FPTAS plan on lanes
        that free as the running samples are predicted to end; under a KV budget, longest first, groups together,
        with SJF refill (the skyline plans a batch from an empty KV, which a running batch is not; the samples
        running on an earlier skyline plan leave it)."""
        release = np.zeros(lanes)
        held = np.array(busy[-lanes:], dtype=float)  # (under M slots at most M run)
        release[:len(held)] = held
        self._plan([*waiting_in(self._admission.queue), *samples], lanes, memory, release, skyline=False)

    def _plan(self, samples: list[Sample], lanes: int, memory: Footprints | None, release: np.ndarray,
              skyline: bool) -> None:
        """``plan``'s work (see there); ``release``: when each lane is free of the samples already running."""
        if not samples:
            self._admission = PlannedOrderAdmission([], [])
            return
        predicted = np.array([s.predicted_len for s in samples], dtype=float)
        if memory is not None and skyline:
            sky = plan_skyline(predicted, np.array([s.prompt_len for s in samples]),
                               np.array([s.group for s in samples]), memory)
            if sky is not None:
                self._admission = SkylinePacedAdmission(samples, sky.start, predicted)
                self._info = {"plan_method": "skyline", "plan_lanes": lanes, "planned_steps": sky.makespan,
                              "plan_pacing": sky.pacing, "plan_paced_quantile": sky.quantile}
                return
        group = np.fromiter((s.group for s in samples), dtype=np.int64, count=len(samples))
        by_group, group_order = members_by_group(group, predicted)
        if memory is not None:
            order = np.concatenate([by_group[g][np.argsort(-predicted[by_group[g]], kind="stable")]
                                    for g in group_order])
            self._info = {"plan_method": "group-major", "plan_lanes": lanes}
        else:
            order = self._plan_lanes(samples, predicted, by_group, group_order, lanes, release)
        self._admission = PlannedOrderAdmission([samples[i] for i in order.tolist()], samples)

    def _plan_lanes(self, samples: list[Sample], predicted: np.ndarray, by_group: dict[int, np.ndarray],
                    group_order: list[int], lanes: int, free: np.ndarray) -> np.ndarray:
        """The FPTAS plan over M slots, chunk by chunk: the samples' admission order (indices into ``samples``);
        ``free``: when each lane is free of what already holds it."""
        allowance = open_prompt_allowance(lanes, float(predicted.max(initial=1.0)))
        chunks = chunk_groups(group_order, [samples[by_group[g][0]].prompt_len for g in group_order], allowance)
        members, start, chunk_of = [], [], []
        free = free.copy()  # when each lane is free of the chunks planned so far
        methods, worst = set(), 0.0
        for c, chunk in enumerate(chunks):
            ids = np.concatenate([by_group[g] for g in chunk])
            schedule = fptas_schedule(predicted[ids], lanes, self.fptas_eps, release=free)
            np.maximum.at(free, schedule.lane, schedule.start + predicted[ids])
            members.append(ids)
            start.append(schedule.start)
            chunk_of.append(np.full(len(ids), c))
            methods.add(schedule.method)
            worst = max(worst, schedule.eps_guaranteed)
        members, start, chunk_of = np.concatenate(members), np.concatenate(start), np.concatenate(chunk_of)
        self._info = {"plan_method": "/".join(sorted(methods)), "plan_lanes": lanes, "plan_chunks": len(chunks),
                      "plan_eps_guaranteed": worst}
        return members[np.lexsort((chunk_of, -predicted[members], start))]  # planned start, longest first

    @property
    def admission(self) -> PlannedOrderAdmission:
        """The rule admitting the current plan (``SkylinePacedAdmission`` for a skyline plan)."""
        return self._admission

    def select(self, fits: Fits, now: int) -> Sample | None:
        return self._admission.select(fits, now)

    def select_when_idle(self, fits: Fits, now: int) -> Sample | None:
        return self._admission.select_when_idle(fits, now)

    def wake_at(self, now: int) -> int | None:
        return self._admission.wake_at(now)

    def on_retire(self, sample: Sample) -> None:
        self._admission.on_retire(sample)

    def requeue(self, sample: Sample) -> None:
        self._admission.requeue(sample)

    def predictions_changed(self, waiting: list[Sample]) -> None:
        self._admission.predictions_changed(waiting)

    @property
    def plan_info(self) -> dict:
        return self._info


class OraclePolicy(InfiniteSamplingPolicy):
    name = "oracle"

    def predictor_for(self, predictor: LengthPredictor) -> LengthPredictor:
        """The true lengths, whatever the rollout's predictor."""
        return OraclePredictor()


POLICIES: dict[str, Callable[..., Policy]] = {
    "full": lambda slots, eps: FullGroupPolicy(),
    "naive": lambda slots, eps: MicroGroupPolicy(round_size=slots),
    "continuous": lambda slots, eps: ContinuousPolicy(),
    "lpt": lambda slots, eps: LongestPredictedFirstPolicy(),
    "infinite": lambda slots, eps: InfiniteSamplingPolicy(eps),
    "oracle": lambda slots, eps: OraclePolicy(eps),
    "plain": lambda slots, eps: PlainSubmissionPolicy(),
}


def members_by_group(group: np.ndarray, predicted: np.ndarray) -> tuple[dict[int, np.ndarray], list[int]]:
    """Each group's members (indices, in the given order) and the groups longest predicted sample first (ties by
    group), from each sample's ``group`` and ``predicted`` length."""
    ids, inverse = np.unique(group, return_inverse=True)
    by_member = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(ids)))[:-1]
    longest = np.full(len(ids), -np.inf)
    np.maximum.at(longest, inverse, predicted)
    members = dict(zip(ids.tolist(), np.split(by_member, bounds)))
    return members, ids[np.lexsort((ids, -longest))].tolist()


def waiting_in(queue) -> list[Sample]:
    """The samples of a policy's queue still waiting, each once, in queue order (a queue may hold stale entries:
    samples admitted out of its order, or requeued after preemption while an older entry remains)."""
    seen: set[int] = set()
    out = []
    for s in queue:
        if s.state is SampleState.WAITING and s.uid not in seen:
            seen.add(s.uid)
            out.append(s)
    return out


def make_policy(name: str, *, slots: int | None = None, fptas_eps: float = 0.02) -> Policy:
    """Build a policy by name; ``slots`` caps naive's rounds (None under a KV budget: rounds fill the budget)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    return POLICIES[name](slots, fptas_eps)
