"""How ``infinite``'s plan is admitted while predictions meet reality: two rules, one per kind of plan.

``PlannedOrderAdmission`` admits in the plan's order and, when the head does not fit, the shortest waiting sample
that does (SJF refill): the rule for an order without start times (the FPTAS plan over M slots, groups longest first
under a KV budget). ``SkylinePacedAdmission`` also keeps a skyline plan's gaps between starts and lets a sample
that ends before the head's planned start go first (backfill), so the plan's memory profile holds.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Callable

import numpy as np

from .sample import Sample, SampleState

Fits = Callable[[Sample], bool]  # whether a sample may start now (the capacity's answer)


class PlannedOrderAdmission:
    """Planned order, SJF refill of what the planned head cannot use."""

    def __init__(self, order: list[Sample], samples: list[Sample]):
        """``order``: the plan's admission order; ``samples``: the same samples in the batch's order."""
        self.queue = deque(order)
        self._tiebreak = itertools.count()
        # the refill's candidates: the plan's samples shortest first (sorted once, read by a cursor), and a heap
        # for what comes later (requeued samples, new predictions); an entry whose sample has run, or whose
        # prediction changed since, is skipped when it surfaces
        predicted = np.fromiter((s.predicted_len for s in samples), dtype=float, count=len(samples))
        uids = np.fromiter((s.uid for s in samples), dtype=np.int64, count=len(samples))
        by_length = np.lexsort((uids, predicted)).tolist()
        self._sorted = [samples[i] for i in by_length]
        self._sorted_len = predicted[by_length].tolist()
        self._cursor = 0
        self._shortest: list = []
        self._shortest_on_plan = False

    def select(self, fits: Fits, now: int) -> Sample | None:
        """The sample to admit at decode step ``now``, or None to admit nothing more for now."""
        head = self._head()
        if head is None:
            return None
        gate = self._gate_now(head, now)
        if (gate is None or now >= gate) and fits(head):
            self._admitting_head(head, now)
            return self.queue.popleft()
        s = self._shortest_waiting()
        if s is None or not fits(s):
            return None
        if gate is not None and now + s.remaining_predicted() > gate:
            return None  # it would still hold KV the head's plan counts on
        self._refilling(s)
        self._take_shortest()
        return s

    def select_when_idle(self, fits: Fits, now: int) -> Sample | None:
        """Nothing runs: the head starts now, whatever its planned start (a plan's gap is never worth an idle
        engine); the plan's later starts keep their gaps from this one."""
        head = self._head()
        if head is None or not fits(head):
            return None
        self._admitting_head(head, now)
        return self.queue.popleft()

    def _gate_now(self, head: Sample, now: int) -> int | None:
        """The step before which ``head`` may not start, or None: an order alone holds nothing back."""
        return None

    def _admitting_head(self, head: Sample, now: int) -> None:
        """``head`` starts now, in planned order."""

    def _refilling(self, s: Sample) -> None:
        """``s`` starts now, ahead of the planned head."""

    def wake_at(self, now: int) -> int | None:
        """A later step at which ``select`` may admit even if nothing retires before (a planned start), or None."""
        return None

    def on_retire(self, sample: Sample) -> None:
        """``sample`` finished."""

    def requeue(self, sample: Sample) -> None:
        """A preempted sample goes back to the head of the line (it has waited longest), and to the refill."""
        self.queue.appendleft(sample)
        heapq.heappush(self._shortest, (sample.predicted_len, sample.uid, next(self._tiebreak), sample))

    def predictions_changed(self, waiting: list[Sample]) -> None:
        """Refills follow the new predictions (an outdated heap entry is skipped when it surfaces)."""
        for s in waiting:
            heapq.heappush(self._shortest, (s.predicted_len, s.uid, next(self._tiebreak), s))

    def _head(self) -> Sample | None:
        while self.queue and self.queue[0].state is not SampleState.WAITING:
            self.queue.popleft()  # already admitted out of order by a refill
        return self.queue[0] if self.queue else None

    def _shortest_waiting(self) -> Sample | None:
        """The waiting sample of the shortest prediction (ties by uid), from the sorted plan or the heap."""
        while self._shortest and _stale(self._shortest[0][0], self._shortest[0][-1]):
            heapq.heappop(self._shortest)  # admitted already, or an outdated prediction (a newer entry exists)
        while self._cursor < len(self._sorted) and _stale(self._sorted_len[self._cursor], self._sorted[self._cursor]):
            self._cursor += 1
        on_plan = self._cursor < len(self._sorted) and (
            not self._shortest
            or (self._sorted_len[self._cursor], self._sorted[self._cursor].uid) <= self._shortest[0][:2])
        self._shortest_on_plan = on_plan  # where ``_take_shortest`` takes it from
        if on_plan:
            return self._sorted[self._cursor]
        return self._shortest[0][-1] if self._shortest else None

    def _take_shortest(self) -> None:
        """The sample ``_shortest_waiting`` answered leaves the refill's candidates."""
        if self._shortest_on_plan:
            self._cursor += 1
        else:
            heapq.heappop(self._shortest)

def _stale(predicted_len: float, s: Sample) -> bool:
    """A refill entry no longer stands: its sample has left the waiting line, or has a newer prediction."""
    return s.state is not SampleState.WAITING or predicted_len != s.predicted_len


class SkylinePacedAdmission(PlannedOrderAdmission):
    """A skyline plan (``core/skyline.py``) at run time: each sample at its planned step, keeping the planned gaps
    between starts while the samples running on plan match the plan's count; a sample that ends before the head's
    planned start may go first (backfill), and then leaves the plan, which stops counting it at its planned steps."""

    def __init__(self, samples: list[Sample], start: np.ndarray, predicted: np.ndarray):
        """``start``: each sample's planned start step, ``predicted`` its predicted length, in ``samples``' order."""
        self.planned_start = {s.uid: int(t) for s, t in zip(samples, start)}  # uid -> planned start step
        self._anchor = (0, 0)  # (planned step, real step) of the latest planned admission
        ends = start + np.maximum(1, np.ceil(predicted - 1e-9)).astype(np.int64)
        self._planned_running = np.zeros(int(ends.max()) + 1, dtype=np.int64)  # samples in flight per step
        np.add.at(self._planned_running, start, 1)
        np.add.at(self._planned_running, ends, -1)
        self._planned_running = np.cumsum(self._planned_running)
        self._planned_end = {s.uid: int(e) for s, e in zip(samples, ends)}
        self._in_flight = 0  # samples running on plan (backfilled ones are outside it)
        self._backfilled: set[int] = set()
        super().__init__(sorted(samples, key=lambda s: (self.planned_start[s.uid], -s.predicted_len, s.uid)), samples)

    def _gate_now(self, head: Sample, now: int) -> int | None:
        """On plan, planned starts keep their gaps. Ahead of it (samples ended early) the next start comes forward;
        behind it (samples outran their predictions) the plan's timing no longer holds: either way, no gate."""
        if self._planned(head) and self._on_plan(now):
            return self._gate(head)
        return None

    def _admitting_head(self, head: Sample, now: int) -> None:
        if self._planned(head):
            self._anchor = (self.planned_start[head.uid], now)
            self._in_flight += 1

    def _refilling(self, s: Sample) -> None:
        if self._planned(s):
            self._leave_plan(s)

    def _gate(self, s: Sample) -> int:
        """The real step at which ``s`` may start: its planned gap after the latest planned admission."""
        planned, real = self._anchor
        return real + self.planned_start[s.uid] - planned

    def _on_plan(self, now: int) -> bool:
        """As many samples run as the plan has running at this point of it (with exact lengths, always); fewer or
        more means some ended before or after their predicted length."""
        planned, real = self._anchor
        return self._in_flight == self._planned_running[min(planned + now - real, len(self._planned_running) - 1)]

    def _planned(self, s: Sample) -> bool:
        """``s`` follows the plan (it has not left it by backfill)."""
        return s.uid not in self._backfilled

    def _leave_plan(self, s: Sample) -> None:
        """``s`` runs now, outside the plan (backfill), and stays outside it until it finishes (also if it is
        preempted and comes back): the plan no longer counts it at its planned steps, so the samples running on plan
        still match the plan's count (with exact lengths: always) and the gates hold."""
        self._planned_running[self.planned_start[s.uid]:self._planned_end[s.uid]] -= 1
        self._backfilled.add(s.uid)

    def wake_at(self, now: int) -> int | None:
        head = self._head()
        if head is None:
            return None
        gate = self._gate(head)
        return gate if gate > now else None

    def on_retire(self, sample: Sample) -> None:
        if sample.uid in self._backfilled:
            self._backfilled.discard(sample.uid)
        else:
            self._in_flight -= 1

    def requeue(self, sample: Sample) -> None:
        super().requeue(sample)
        if self._planned(sample):
            self._in_flight -= 1  # (a backfilled one was never counted on plan, and stays off it)
