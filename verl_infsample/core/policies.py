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
               planned start order. Under a KV budget, where each group in flight holds its prompt:
               groups kept together, longest first. Either way, when the next planned sample does not
               fit the free KV, the shortest waiting sample that does fit goes first (SJF refill)
``oracle``     ``infinite`` with the true lengths: what a perfect predictor would buy
=============  ==========================================================================================
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Callable

import numpy as np

from .fptas import fptas_schedule
from .sample import Sample, SampleState

Fits = Callable[[Sample], bool]


class Policy:
    name: str = ""
    uses_predictor = False  # baselines reserve max_len; predictive policies reserve predicted_len
    ignores_capacity = False
    forced_predictor: str | None = None

    def plan(self, samples: list[Sample], lanes: int, prompts_cost_memory: bool = False) -> None:
        """Called once with every sample of the batch, in (group, index) order.

        ``lanes``: how many samples decode at once (M, or what a KV budget holds on average).
        ``prompts_cost_memory``: True under a KV budget, where every group in flight holds its prompt's KV.
        """
        self.queue = deque(samples)

    def select(self, fits: Fits) -> Sample | None:
        """The sample to admit now, or None to admit nothing more until something retires."""
        if self.queue and fits(self.queue[0]):
            return self.queue.popleft()
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


class LongestPredictedFirstPolicy(Policy):
    name = "lpt"
    uses_predictor = True

    def plan(self, samples: list[Sample], lanes: int, prompts_cost_memory: bool = False) -> None:
        self.queue = deque(sorted(samples, key=lambda s: (-s.predicted_len, s.uid)))


class MicroGroupPolicy(Policy):
    """Rounds of at most ``round_size`` samples of one group; the next round waits for the whole round to end."""

    name = "naive"

    def __init__(self, round_size: int | None = None):
        self.round_size = round_size
        self.in_flight = 0
        self.admitted_in_round = 0
        self.round_open = True
        self.round_group = -1

    def select(self, fits: Fits) -> Sample | None:
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
    ignores_capacity = True

    def __init__(self):
        super().__init__(round_size=None)


class InfiniteSamplingPolicy(Policy):
    """Global FPTAS plan, planned-order admission, shortest-job-first refill of what the plan's head cannot use."""

    name = "infinite"
    uses_predictor = True

    def __init__(self, fptas_eps: float = 0.02):
        self.fptas_eps = fptas_eps
        self._info: dict = {}

    def plan(self, samples: list[Sample], lanes: int, prompts_cost_memory: bool = False) -> None:
        """Groups one after another (each group in flight holds its prompt's KV, so few should be open at once),
        longest predicted group first, samples longest first within a group. The last group forms the tail, where
        the lanes must end together: its samples follow the FPTAS plan's start order (with one group, B=1 as in the
        paper, that is the whole plan). Under a KV budget, longest first throughout (it packs the budget)."""
        by_group: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            by_group.setdefault(s.group, []).append(i)
        predicted = np.array([s.predicted_len for s in samples], dtype=float)
        group_order = sorted(by_group, key=lambda g: (-predicted[by_group[g]].max(), g))
        order, methods, worst = [], set(), 0.0
        for g in group_order:
            members = np.array(by_group[g])
            if prompts_cost_memory or g != group_order[-1]:
                order.extend(members[np.argsort(-predicted[members], kind="stable")])
                continue
            schedule = fptas_schedule(predicted[members], min(lanes, len(members)), self.fptas_eps)
            order.extend(members[np.lexsort((-predicted[members], schedule.start))])  # planned start, longest first
            methods.add(schedule.method)
            worst = max(worst, schedule.eps_guaranteed)
        self._info = {"plan_method": "group-major" + (f"+{'/'.join(sorted(methods))}" if methods else ""),
                      "plan_lanes": lanes, **({"plan_eps_guaranteed": worst} if methods else {})}
        self.queue = deque(samples[i] for i in order)
        self._tiebreak = itertools.count()
        self._shortest = [(s.predicted_len, s.uid, next(self._tiebreak), s) for s in samples]
        heapq.heapify(self._shortest)

    def select(self, fits: Fits) -> Sample | None:
        while self.queue and self.queue[0].state is not SampleState.WAITING:
            self.queue.popleft()  # already admitted out of order by the SJF refill
        if not self.queue:
            return None
        if fits(self.queue[0]):
            return self.queue.popleft()
        while self._shortest and (self._shortest[0][-1].state is not SampleState.WAITING
                                  or self._shortest[0][0] != self._shortest[0][-1].predicted_len):
            heapq.heappop(self._shortest)  # admitted already, or an outdated prediction (a newer entry exists)
        if self._shortest and fits(self._shortest[0][-1]):
            return heapq.heappop(self._shortest)[-1]
        return None

    def requeue(self, sample: Sample) -> None:
        super().requeue(sample)
        heapq.heappush(self._shortest, (sample.predicted_len, sample.uid, next(self._tiebreak), sample))

    def predictions_changed(self, waiting: list[Sample]) -> None:
        """SJF refill follows the new predictions (an outdated heap entry is skipped when it surfaces)."""
        for s in waiting:
            heapq.heappush(self._shortest, (s.predicted_len, s.uid, next(self._tiebreak), s))

    @property
    def plan_info(self) -> dict:
        return self._info


class OraclePolicy(InfiniteSamplingPolicy):
    name = "oracle"
    forced_predictor = "oracle"


POLICIES: dict[str, Callable[..., Policy]] = {
    "full": lambda slots, eps: FullGroupPolicy(),
    "naive": lambda slots, eps: MicroGroupPolicy(round_size=slots),
    "continuous": lambda slots, eps: ContinuousPolicy(),
    "lpt": lambda slots, eps: LongestPredictedFirstPolicy(),
    "infinite": lambda slots, eps: InfiniteSamplingPolicy(eps),
    "oracle": lambda slots, eps: OraclePolicy(eps),
}


def make_policy(name: str, *, slots: int | None = None, fptas_eps: float = 0.02) -> Policy:
    """Build a policy by name; ``slots`` caps naive's rounds (None under a KV budget: rounds fill the budget)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    return POLICIES[name](slots, fptas_eps)
