"""Global plan: balance predicted decode work over M slots with a (1+eps)-approximation.

Formulation
-----------
With continuous refill, each of the M slots ("lanes") decodes a sequence of samples back to back, one token per
decode step. A sample of length p occupies its lane for p steps, so the rollout takes as many decode steps as the
most loaded lane: this is identical-machine makespan scheduling, P_M || C_max.

* objective:   minimise C_max = max over lanes of the sum of (predicted) lengths assigned to it
* constraint:  every sample on exactly one lane; at most M lanes (the memory-feasible slot count)
* lower bound: LB = max(longest sample, total / M) <= OPT   (the bound `simulate` reports, in steps)
* guarantee:   ``fptas_schedule`` returns C_max <= OPT + eps * LB <= (1 + eps) * OPT

P || C_max is strongly NP-hard when M is part of the input, so no algorithm is polynomial in M and 1/eps together;
the classical FPTAS (Sahni, 1976) is polynomial in n and 1/eps for a fixed M. Ours:

1. LPT (longest first onto the least loaded lane). If its C_max <= (1 + eps) * LB, it is certified and returned:
   at realistic sizes (hundreds of samples per lane) this is almost always the case, so planning is O(n log n).
2. Otherwise split the samples: *big* (p > eps * LB) and *small*. Round big lengths up to multiples of
   delta = eps * LB / k, where k = floor(U / (eps * LB)) bounds the number of big samples per lane in any schedule
   no worse than LPT's C_max = U. An exact dynamic program over sorted lane-load vectors (states pruned at U) finds
   the best rounded assignment up to a slack: with delta = eps * LB / (2k) and a slack of eps * LB / 2, its true
   C_max is at most OPT_big + k * delta + eps * LB / 2 = OPT_big + eps * LB. The DP has at most (U / delta)^M states
   per layer: polynomial in n and 1/eps for fixed M. It is explored depth first, each state once, pruned by bounds
   (an exact DP over the states that can still matter), which keeps it fast in practice.
3. Small samples go greedily onto the least loaded lane. If the lane that finishes last ends with a small sample,
   that sample started no later than total / M <= OPT, so C_max <= OPT + eps * LB; otherwise C_max is that of
   step 2. Either way C_max <= OPT + eps * LB.

Lanes that free at different times (``release``: a chunk of the plan planned after another, whose samples still
hold the lanes) are the same problem with initial loads, P_M | a_i | C_max: each lane's load starts at its release
time, C_max counts it, and LB = max(latest release, earliest release + longest sample, (releases + total) / M).
LPT, the DP (loads start at the releases rounded up to delta units: one more delta per lane, paid for by rounding
with delta = eps * LB / (2 (k + 1))) and the greedy small samples carry over, and so does the bound.

If the search would visit more than ``max_states`` states (many lanes, a tight instance), it stops with the best
schedule found (never worse than LPT) and reports the a-posteriori guarantee C_max / LB - 1 as
``eps_guaranteed``: the bound degrades visibly, never silently.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LaneSchedule:
    """An assignment of jobs to lanes. ``start`` is each job's start step when every lane runs its jobs in order."""

    lane: np.ndarray  # int, lane of each job
    start: np.ndarray  # float, start time of each job
    makespan: float
    lower_bound: float
    eps_guaranteed: float | None  # C_max <= OPT + eps_guaranteed * LB; None = no guarantee (heuristic)
    method: str

    @property
    def ratio_to_bound(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0


def lower_bound(lengths: np.ndarray, lanes: int, release: np.ndarray | None = None) -> float:
    """max(longest job, total / lanes): no schedule on ``lanes`` lanes finishes sooner. With lanes free from
    ``release`` on: max(latest release, earliest release + longest job, (releases + total) / lanes)."""
    if release is not None:
        longest = float(np.max(lengths, initial=0.0))
        return max(float(np.max(release)), float(np.min(release)) + longest,
                   (float(np.sum(release)) + float(np.sum(lengths))) / lanes)
    if len(lengths) == 0:
        return 0.0
    return max(float(np.max(lengths)), float(np.sum(lengths)) / lanes)


def lower_bound_with_arrivals(lengths, arrivals, lanes: int) -> float:
    """No schedule on ``lanes`` lanes of jobs that arrive over time (job i at ``arrivals[i]``, taking ``lengths[i]``)
    ends before any job's arrival plus its length, nor, for any t, before t plus the work arriving at or after t
    over ``lanes``."""
    lengths = np.asarray(lengths, dtype=float)
    arrivals = np.asarray(arrivals, dtype=float)
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    if lengths.shape != arrivals.shape:
        raise ValueError(f"one arrival per job: {len(arrivals)} arrivals for {len(lengths)} jobs")
    if len(lengths) == 0:
        return 0.0
    order = np.argsort(arrivals, kind="stable")
    later_work = np.cumsum(lengths[order][::-1])[::-1]  # the work arriving at or after each job, in arrival order
    return max(float(np.max(arrivals + lengths)), float(np.max(arrivals[order] + later_work / lanes)))


def _schedule_from_lanes(lengths: np.ndarray, lane: np.ndarray, lanes: int,
                         release: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Start times with each lane running its jobs longest first (long, uncertain work starts early), from its
    ``release`` time on."""
    order = np.lexsort((-lengths, lane))  # by lane, then longest first
    ends = np.cumsum(lengths[order])
    lane_sorted = lane[order]
    first = np.r_[True, lane_sorted[1:] != lane_sorted[:-1]] if len(order) else np.zeros(0, dtype=bool)
    # subtract, within each lane, the cumulative work of the lanes before it
    offsets = np.maximum.accumulate(np.where(first, ends - lengths[order], 0.0)) if len(order) else ends
    start = np.empty(len(lengths), dtype=float)
    start[order] = ends - lengths[order] - offsets
    if release is None:
        return start, float(np.max(ends - offsets, initial=0.0))
    start += release[lane]
    return start, float(np.max(np.bincount(lane, weights=lengths, minlength=lanes) + release))


def _greedy_onto_lanes(lengths: np.ndarray, jobs: np.ndarray, loads: list[float], lane: np.ndarray) -> None:
    """List-schedule ``jobs`` (in the given order) onto the least loaded lane; updates ``loads`` and ``lane``."""
    heap = [(load, i) for i, load in enumerate(loads)]
    heapq.heapify(heap)
    chosen = []
    for p in lengths[jobs].tolist():
        load, i = heap[0]
        chosen.append(i)
        heapq.heapreplace(heap, (load + p, i))
    lane[jobs] = chosen
    for load, i in heap:
        loads[i] = load


def lpt_schedule(lengths, lanes: int, release=None) -> LaneSchedule:
    """Longest processing time first: a 4/3-approximation, and the baseline the FPTAS must match or beat.
    ``release``: when each lane is free (default: all at 0)."""
    lengths = np.asarray(lengths, dtype=float)
    _check(lengths, lanes)
    release = _release(release, lanes)
    lane = np.zeros(len(lengths), dtype=np.int64)
    loads = [0.0] * lanes if release is None else release.tolist()
    _greedy_onto_lanes(lengths, np.argsort(-lengths, kind="stable"), loads, lane)
    start, makespan = _schedule_from_lanes(lengths, lane, lanes, release)
    return LaneSchedule(lane, start, makespan, lower_bound(lengths, lanes, release), None, "lpt")


MAX_STATES = 20_000  # the search's state budget ...
STATE_LANE_WORK = 400_000  # ... and its work in lane loads sorted: a state costs O(M log M), so M=128 gets 3125
# (and M=8192, a plan over 8 replicas x 1024 slots, the floor of 32)


def fptas_schedule(lengths, lanes: int, eps: float = 0.05, max_states: int | None = None,
                   release=None) -> LaneSchedule:
    """(1+eps)-approximate P_M || C_max (see the module docstring for the bound and its proof); ``release``: when
    each lane is free (P_M | a_i | C_max; default: all at 0). Time is counted from the earliest release, so the
    bound's eps * LB is a share of the work from then on, not of what ran before (a plan's later chunks).
    ``max_states`` (default: ``MAX_STATES``, fewer with many lanes, so a plan stays fast at every M) bounds the
    search; past it the plan reports the bound it has (``eps_guaranteed``)."""
    if not 0 < eps < 1:
        raise ValueError(f"fptas_eps must be in (0, 1), got {eps}")
    if max_states is None:
        max_states = min(MAX_STATES, max(32, STATE_LANE_WORK // max(1, lanes)))
    release = _release(release, lanes)
    shift = 0.0 if release is None else float(release.min())
    plan = _fptas(np.asarray(lengths, dtype=float), lanes, eps, max_states,
                  None if release is None else _release(release - shift, lanes))
    if not shift:
        return plan
    return LaneSchedule(plan.lane, plan.start + shift, plan.makespan + shift, plan.lower_bound + shift,
                        plan.eps_guaranteed, plan.method)


def _fptas(lengths: np.ndarray, lanes: int, eps: float, max_states: int, release: np.ndarray | None) -> LaneSchedule:
    """``fptas_schedule`` on checked releases, the earliest at 0 (or None: every lane free at 0)."""
    lpt = lpt_schedule(lengths, lanes, release)
    lb = lpt.lower_bound
    if len(lengths) == 0 or lpt.makespan <= lb + eps * lb:
        return LaneSchedule(lpt.lane, lpt.start, lpt.makespan, lb, lpt.ratio_to_bound - 1.0, "lpt-certified")

    big = np.flatnonzero(lengths > eps * lb)
    small = np.flatnonzero(lengths <= eps * lb)
    big = big[np.argsort(-lengths[big], kind="stable")]
    lane = np.zeros(len(lengths), dtype=np.int64)
    if len(big) <= lanes and release is None:  # one big job per lane is optimal for the big jobs
        lane[big] = np.arange(len(big))
        loads = [0.0] * lanes
        for j in big:
            loads[lane[j]] += float(lengths[j])
        eps_done = 0.0
    else:
        # half of eps pays for rounding (k big jobs per lane, each rounded up by < delta, and with releases the
        # release too), half for the search slack
        k = max(1, math.floor(lpt.makespan / (eps * lb)))
        delta = 0.5 * eps * lb / (k if release is None else k + 1)
        base = None if release is None else [int(math.ceil(r / delta - 1e-9)) for r in release]
        assignment, complete = _rounded_dp(lengths[big], lanes, delta, 0.5 * eps * lb, max_states, base)
        lane[big] = assignment
        loads = np.bincount(assignment, weights=lengths[big], minlength=lanes)
        loads = (loads if release is None else loads + release).tolist()
        eps_done = eps if complete else math.inf  # incomplete search: only the a-posteriori bound below holds
    small = small[np.argsort(-lengths[small], kind="stable")]
    _greedy_onto_lanes(lengths, small, loads, lane)
    start, makespan = _schedule_from_lanes(lengths, lane, lanes, release)
    method = "fptas" if eps_done <= eps else "fptas-budget"
    if makespan > lpt.makespan:  # both are valid; the better one keeps the guarantee
        lane, start, makespan = lpt.lane, lpt.start, lpt.makespan
    # C_max <= OPT + (C_max / LB - 1) * LB always holds, since LB <= OPT: report the tighter of the two bounds
    return LaneSchedule(lane, start, makespan, lb, min(eps_done, makespan / lb - 1.0), method)


def _rounded_dp(big: np.ndarray, lanes: int, delta: float, slack: float, max_states: int,
                base: list[int] | None = None):
    """Exact DP over sorted lane-load vectors of the rounded big jobs, explored depth first with bounds.

    A state is (next job, sorted lane loads in delta units); each is expanded once (memo), and pruned when its
    lower bound max(max load, (sum + remaining) / lanes) cannot beat the best schedule found so far (initially LPT's,
    rounded) by more than ``slack`` (in lengths): the result is within ``slack`` of the rounded optimum. Exploring
    the DP this way visits a subset of its states, typically a tiny one. Returns (assignment, complete): complete is
    False when the search stopped at ``max_states`` states with the best assignment found so far. ``base``: each
    lane's load before any job (its release, in delta units).
    """
    units = [int(math.ceil(p / delta - 1e-9)) for p in big]
    slack_units = int(math.floor(slack / delta))
    n = len(units)
    suffix = [0] * (n + 1)
    for j in range(n - 1, -1, -1):
        suffix[j] = suffix[j + 1] + units[j]
    # incumbent: LPT in rounded units, improved by moves and swaps; the search only has to beat it
    base = [0] * lanes if base is None else list(base)
    inc_lane = np.zeros(n, dtype=np.int64)
    _greedy_onto_lanes(np.asarray(units, dtype=float), np.arange(n), [float(b) for b in base], inc_lane)
    inc_lane = _improve_by_swaps(units, inc_lane, lanes, base)
    best = [max(np.bincount(inc_lane, weights=units, minlength=lanes).astype(int) + base), inc_lane]
    # no rounded schedule beats this
    floor_units = max(max(base), min(base) + units[0], -(-(sum(base) + suffix[0]) // lanes))
    loads = list(base)
    chosen = np.zeros(n, dtype=np.int64)
    seen: set = set()

    def enter(j: int) -> _Frame | None:
        """Visit the state (j, loads): a frame whose lanes are still to try, or None for a leaf or a pruned state."""
        if j == n:
            if max(loads) < best[0]:
                best[0], best[1] = max(loads), chosen.copy()
            return None
        now = np.array(loads, dtype=np.int64)
        order = np.argsort(now, kind="stable")  # the lanes least loaded first: the state, and the order to try
        key = (j, now[order].tobytes())
        if key in seen:
            return None
        seen.add(key)
        if len(seen) > max_states:
            raise _StateBudgetExceeded
        if max(int(now[order[-1]]), -(-(int(now.sum()) + suffix[j]) // lanes)) + slack_units >= best[0]:
            return None
        return _Frame(j, order.tolist())

    # depth first with an explicit stack: the depth is the number of big jobs, which no call stack holds
    try:
        root = enter(0)
        stack = [] if root is None else [root]
        while stack and best[0] > floor_units:
            frame = stack[-1]
            j, u = frame.job, units[frame.job]
            if frame.placed >= 0:  # back from a child: undo its placement
                loads[frame.placed] -= u
                frame.placed = -1
            child = None
            while child is None and frame.next < lanes:
                i = frame.order[frame.next]
                frame.next += 1
                if loads[i] in frame.tried or loads[i] + u + slack_units >= best[0]:
                    continue
                frame.tried.add(loads[i])
                loads[i] += u
                chosen[j] = i
                child = enter(j + 1)
                if child is None:
                    loads[i] -= u
                else:
                    frame.placed = i
            if child is None:
                stack.pop()
            else:
                stack.append(child)
    except _StateBudgetExceeded:
        return best[1], False
    return best[1], True


@dataclass
class _Frame:
    """One state of ``_rounded_dp``'s search on its stack: the lanes in load order, the next one to try, the loads
    already tried (equal loads give equal subtrees) and the lane holding this job while its subtree is searched."""

    job: int
    order: list[int]
    next: int = 0
    placed: int = -1
    tried: set = field(default_factory=set)


SWAP_LANES = 4  # the local search pairs the most loaded lane with this many of the least loaded


def _improve_by_swaps(units: list[int], lane: np.ndarray, lanes: int, base: list[int]) -> np.ndarray:
    """Local search: move one job off the most loaded lane, or swap it for a shorter one, onto one of the
    ``SWAP_LANES`` least loaded lanes (a move gains min(d, gap - d) for a load gap, so the largest gaps are there),
    while that lowers the pair's maximum (the sum of squared loads drops each time, so it terminates). It only
    improves the DP's incumbent: the search's bound does not depend on it. ``base``: each lane's load before its
    jobs."""
    lane = lane.copy()
    units = np.asarray(units, dtype=np.int64)
    loads = np.bincount(lane, weights=units, minlength=lanes).astype(np.int64) + np.asarray(base, dtype=np.int64)
    members = [[] for _ in range(lanes)]
    for j, i in enumerate(lane.tolist()):
        members[i].append(j)
    by_load = [(load, i) for i, load in enumerate(loads.tolist())]  # a min-heap with stale entries skipped
    heapq.heapify(by_load)
    while True:
        hi = int(np.argmax(loads))
        if not members[hi]:  # the most loaded lane is its release alone: no move lowers the maximum
            return lane
        least: list[int] = []
        while len(least) <= SWAP_LANES and by_load:
            load, i = heapq.heappop(by_load)
            if load == loads[i] and i not in least:
                least.append(i)  # least loaded first, ties by lane
        for i in least:
            heapq.heappush(by_load, (int(loads[i]), i))
        on_hi = np.asarray(sorted(members[hi]), dtype=np.int64)
        best_gain, best_move = 0, None
        for lo in least:
            if lo == hi:
                continue
            on_lo = sorted(members[lo])
            # rows: a job on hi; columns: a move (nothing back), then a swap with each job on lo
            d = units[on_hi][:, None] - np.concatenate([[0], units[on_lo]])[None, :]
            gain = np.where(d > 0, loads[hi] - np.maximum(loads[hi] - d, loads[lo] + d), 0)
            at = int(np.argmax(gain))
            if gain.flat[at] > best_gain:
                a, col = divmod(at, d.shape[1])
                best_gain = int(gain.flat[at])
                best_move = (int(on_hi[a]), None if col == 0 else on_lo[col - 1], lo, int(d.flat[at]))
        if best_move is None:
            return lane
        a, b, lo, d = best_move
        lane[a] = lo
        members[hi].remove(a)
        members[lo].append(a)
        if b is not None:
            lane[b] = hi
            members[lo].remove(b)
            members[hi].append(b)
        loads[hi] -= d
        loads[lo] += d
        heapq.heappush(by_load, (int(loads[hi]), hi))
        heapq.heappush(by_load, (int(loads[lo]), lo))


class _StateBudgetExceeded(Exception):
    pass


def exact_makespan(lengths, lanes: int, release=None) -> float:
    """Optimal C_max by branch and bound (small instances only: the reference the FPTAS is tested against), with
    lanes free from ``release`` on (default: all at 0)."""
    lengths = sorted((float(x) for x in lengths), reverse=True)
    _check(np.asarray(lengths), lanes)
    release = _release(release, lanes)
    lb = lower_bound(np.asarray(lengths), lanes, release)
    best = lpt_schedule(lengths, lanes, release).makespan
    loads = [0.0] * lanes if release is None else release.tolist()
    suffix = np.concatenate([np.cumsum(lengths[::-1])[::-1], [0.0]])

    def search(j: int) -> None:
        nonlocal best
        if best <= lb + 1e-9:
            return
        if j == len(lengths):
            best = min(best, max(loads))
            return
        if max(max(loads), (sum(loads) + suffix[j]) / lanes) >= best - 1e-9:
            return
        tried = set()
        for i in range(lanes):
            if loads[i] in tried or loads[i] + lengths[j] >= best - 1e-9:
                continue
            tried.add(loads[i])
            loads[i] += lengths[j]
            search(j + 1)
            loads[i] -= lengths[j]

    search(0)
    return best


def _release(release, lanes: int) -> np.ndarray | None:
    """``release`` as floats, one per lane, or None when every lane is free at 0 (the plain problem)."""
    if release is None:
        return None
    release = np.asarray(release, dtype=float)
    if release.shape != (lanes,) or float(np.min(release, initial=0.0)) < 0:
        raise ValueError(f"release must be {lanes} non-negative times, one per lane, got {release.tolist()}")
    return release if release.any() else None


def _check(lengths: np.ndarray, lanes: int) -> None:
    if lanes < 1:
        raise ValueError(f"slots must be >= 1, got {lanes}")
    if len(lengths) and float(np.min(lengths)) < 0:
        raise ValueError("lengths must be non-negative")
