"""Balanced k-way partitioning of per-sequence workloads: the actor-update batch balancer.

Before the actor update, the trainer splits the global batch into k partitions, one per data-parallel rank; the
update step takes as long as the most loaded rank, so the objective is again the makespan.

Formulation
-----------
Given workloads w_1..w_n >= 0 (verl uses w = 24576 * s + s^2 for a sequence of s tokens) and k partitions:

* objective:   minimise C_max = max over partitions of the sum of the workloads assigned to it
* constraint:  every item in exactly one partition; with ``equal_size`` every partition holds exactly n / k items
               (verl's dispatch splits the reordered batch into k equal chunks, so n % k == 0 is required)
* lower bound: LB = max(total / k, largest item) <= OPT (with or without the size constraint)

Method and guarantees
---------------------
Unconstrained (``equal_size=False``): this is P_k || C_max. ``fptas_schedule`` gives C_max <= (1 + eps) * OPT (see
``fptas.py``; if its state budget is exhausted it only reports the weaker a-posteriori bound). Candidates are that
schedule, a port of verl's Karmarkar-Karp and any ``incumbents`` passed in; each is improved by the local search
below (moves and swaps) and the best is kept, so the FPTAS bound holds whenever the FPTAS certified it, and the result
is never worse than any candidate. Empty partitions (verl rejects them) are filled by moving the lightest item of a
partition holding >= 2 items, which cannot raise the maximum.

Equal sizes (``equal_size=True``): a cardinality-constrained makespan problem, for which we give *no*
approximation bound. It is a heuristic with a guarantee relative to its incumbents:

1. candidates: (a) a faithful port of verl 0.9.1's ``karmarkar_karp`` (largest differencing method with equal-size
   k-tuples, same tie breaking; the tests check it reproduces verl's partitions exactly), (b) LPT with cardinality
   (longest first onto the least loaded partition that still has room), (c) any ``incumbents`` the caller passes,
   e.g. the partitions of the real verl function;
2. each candidate is improved by pairwise-swap local search and the best result is kept: take the most loaded
   partition H; for every other partition L, find the swap of a in H with b in L that lowers max(load_H, load_L)
   the most (w_a - w_b closest to (load_H - load_L) / 2, found by binary search over L's sorted workloads, so a
   round is O(k * m log m) for m = n / k items per partition) and apply the best one. When H admits no improving
   swap, one balancing swap between two other partitions is applied (it may unblock H) and the search goes on; it
   stops when neither exists. Swaps keep every partition's size. Every applied swap lowers the larger load of its
   pair, so the maximum never rises, and strictly lowers the sum of squared loads, so the search terminates (a round
   cap, 20 * n by default, bounds its time anyway).

Guarantee (both cases): C_max(result) <= min over candidates of C_max, in particular <= verl's Karmarkar-Karp on
the same input. For integer workloads all load arithmetic is exact (int64).
"""

from __future__ import annotations

import heapq

import numpy as np

from .fptas import fptas_schedule


def balanced_partitions(
    workloads,
    k: int,
    equal_size: bool,
    eps: float = 0.02,
    incumbents: list[list[list[int]]] | None = None,
    kk_seed: bool = True,
    max_rounds: int | None = None,
) -> list[list[int]]:
    """Split ``range(len(workloads))`` into ``k`` partitions minimising the largest partition workload.

    Args:
        workloads: non-negative per-item workloads (a sequence, numpy array or CPU tensor).
        k: number of partitions.
        equal_size: every partition gets exactly ``len(workloads) // k`` items (requires ``len % k == 0``).
        eps: accuracy of the FPTAS used when ``equal_size`` is False.
        incumbents: further candidate partitionings (lists of k index lists, each respecting the size constraint):
            the result is never worse than any of them.
        kk_seed: also seed with the port of verl's Karmarkar-Karp (disable when the caller passes verl's own
            partitions as an incumbent, to avoid computing the same thing twice).
        max_rounds: cap on local-search rounds (default ``20 * n``); only bounds time, never the guarantee.

    Returns:
        k lists of item indices, every index exactly once, each list sorted ascending; the partitions are ordered by
        decreasing workload (like verl's ``karmarkar_karp``).
    """
    w = _as_workloads(workloads)
    n = len(w)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if equal_size and n % k != 0:
        raise ValueError(f"equal_size needs len(workloads) % k == 0, got {n} % {k}")
    if n == 0:
        return [[] for _ in range(k)]

    candidates: list[np.ndarray] = []
    if kk_seed:
        candidates.append(_labels_from_partitions(karmarkar_karp_port(w.tolist(), k, equal_size), n, k))
    if equal_size:
        candidates.append(_lpt_cardinality(w, k))
    else:
        candidates.append(np.asarray(fptas_schedule(w.astype(float), k, eps).lane, dtype=np.int64))
    for inc in incumbents or []:
        labels = _labels_from_partitions(inc, n, k)
        if equal_size and np.any(np.bincount(labels, minlength=k) != n // k):
            raise ValueError("an incumbent violates the equal-size constraint")
        candidates.append(labels)

    rounds = 20 * n if max_rounds is None else max_rounds
    improved = [_local_search(w, labels, k, allow_moves=not equal_size, max_rounds=rounds) for labels in candidates]
    labels = min(improved, key=lambda labels: _loads(w, labels, k).max())
    if not equal_size:
        labels = _fill_empty(w, labels, k)
    return _partitions_from_labels(w, labels, k)


def partition_spread(workloads, partitions) -> dict:
    """Workload balance of a partitioning: max, min and mean partition workload, and max / mean."""
    w = _as_workloads(workloads)
    sums = np.array([w[np.asarray(p, dtype=np.int64)].sum() if len(p) else 0 for p in partitions], dtype=float)
    mean = float(w.sum()) / len(partitions)
    return {
        "max": float(sums.max()),
        "min": float(sums.min()),
        "mean": mean,
        "max_over_mean": float(sums.max()) / mean if mean > 0 else 1.0,
    }


def max_workload(workloads, partitions) -> float:
    """The objective: the largest partition workload."""
    return partition_spread(workloads, partitions)["max"]


# ---------------------------------------------------------------------------------------------------- candidates


def karmarkar_karp_port(seqlen_list: list, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """A port of verl 0.9.1 ``verl.utils.seqlen_balancing.karmarkar_karp`` (Apache-2.0, Bytedance), same algorithm
    and tie breaking, so that this module can seed with verl's solution without importing verl (or torch).

    Largest differencing method: with ``equal_size`` the sorted items are cut into consecutive k-tuples, each a
    state of k singleton sets; repeatedly the two states of largest spread are merged, largest set with smallest.
    """

    class _Set:
        __slots__ = ("sum", "items")

        def __init__(self) -> None:
            self.sum = 0
            self.items: list = []

        def add(self, idx, val) -> None:
            self.items.append((idx, val))
            self.sum += val

        def merge(self, other) -> None:
            for idx, val in other.items:
                self.items.append((idx, val))
                self.sum += val

        def __lt__(self, other) -> bool:
            if self.sum != other.sum:
                return self.sum < other.sum
            if len(self.items) != len(other.items):
                return len(self.items) < len(other.items)
            return self.items < other.items

    class _State:
        __slots__ = ("k", "sets")

        def __init__(self, items, k: int) -> None:
            self.k = k
            self.sets = [_Set() for _ in range(k)]
            for i, (idx, seqlen) in enumerate(items):
                self.sets[i].add(idx, seqlen)
            self.sets = sorted(self.sets, reverse=True)

        def merge(self, other) -> None:
            for i in range(self.k):
                self.sets[i].merge(other.sets[self.k - 1 - i])
            self.sets = sorted(self.sets, reverse=True)

        @property
        def spread(self):
            return self.sets[0].sum - self.sets[-1].sum

        def __lt__(self, other) -> bool:
            if self.spread != other.spread:
                return self.spread > other.spread
            return self.sets[0] > other.sets[0]

    ordered = sorted([(seqlen, i) for i, seqlen in enumerate(seqlen_list)])
    heap: list = []
    if equal_size:
        if len(seqlen_list) % k_partitions:
            raise ValueError(f"{len(seqlen_list)} % {k_partitions} != 0")
        for off in range(0, len(ordered), k_partitions):
            heapq.heappush(heap, _State([(idx, s) for s, idx in ordered[off:off + k_partitions]], k_partitions))
    else:
        for s, idx in ordered:
            heapq.heappush(heap, _State([(idx, s)], k_partitions))
    while len(heap) > 1:
        s0 = heapq.heappop(heap)
        s1 = heapq.heappop(heap)
        s0.merge(s1)
        heapq.heappush(heap, s0)
    if not heap:
        return [[] for _ in range(k_partitions)]
    return [[idx for idx, _ in st.items] for st in heap[0].sets]


def _lpt_cardinality(w: np.ndarray, k: int) -> np.ndarray:
    """Longest first onto the least loaded partition that still has room (n / k items each)."""
    cap = len(w) // k
    labels = np.empty(len(w), dtype=np.int64)
    count = [0] * k
    heap = [(w.dtype.type(0), i) for i in range(k)]
    for j in np.argsort(-w, kind="stable").tolist():
        load, i = heapq.heappop(heap)
        labels[j] = i
        count[i] += 1
        if count[i] < cap:
            heapq.heappush(heap, (load + w[j], i))
    return labels


# ---------------------------------------------------------------------------------------------------- local search


def _local_search(w: np.ndarray, labels: np.ndarray, k: int, allow_moves: bool, max_rounds: int) -> np.ndarray:
    """Best-improvement swaps (and, without the size constraint, moves) out of the most loaded partition; when none
    helps, one balancing swap between another pair of partitions, then back to the most loaded one.

    Every applied step lowers the larger load of the two partitions involved, hence never raises the maximum, and
    strictly lowers the sum of squared loads, hence the search terminates.
    """
    labels = labels.copy()
    if k < 2:
        return labels
    exact = np.issubdtype(w.dtype, np.integer)
    loads = _loads(w, labels, k)
    tol = 0 if exact else 1e-12 * float(max(loads.max(), 1e-300))
    # members of each partition, sorted by workload
    members = []
    for p in range(k):
        idx = np.flatnonzero(labels == p)
        members.append(idx[np.argsort(w[idx], kind="stable")])

    def best_step(h: int, others) -> tuple:
        """The step between partition h (the heavier one) and one of ``others`` that lowers loads[h] the most."""
        best_gain, best = tol, None
        on_h = members[h]
        if len(on_h) == 0:
            return best_gain, best
        wa = w[on_h]
        for p in others:
            gap = loads[h] - loads[p]
            if gap <= tol:
                continue
            on_p = members[p]
            if len(on_p):
                # swap a (in h) with b (in p): d = w_a - w_b, new pair maximum loads[h] - min(d, gap - d);
                # the best b for each a is the neighbour of w_a - gap / 2 in p's sorted workloads
                wb = w[on_p]
                pos = np.searchsorted(wb, wa - gap / 2)
                for cand in (np.clip(pos - 1, 0, len(wb) - 1), np.minimum(pos, len(wb) - 1)):
                    d = wa - wb[cand]
                    gain = np.minimum(d, gap - d)
                    i = int(np.argmax(gain))
                    if gain[i] > best_gain:
                        best_gain, best = gain[i], (h, p, i, int(cand[i]))
            if allow_moves:
                gain = np.minimum(wa, gap - wa)
                i = int(np.argmax(gain))
                if gain[i] > best_gain:
                    best_gain, best = gain[i], (h, p, i, None)
        return best_gain, best

    for _ in range(max_rounds):
        h = int(np.argmax(loads))
        _, step = best_step(h, range(k))
        if step is None:
            # the most loaded partition is stuck: balance another pair (heaviest first), which may unblock it
            for q in sorted(range(k), key=lambda p: -loads[p]):
                if q != h and loads[q] < loads[h]:
                    _, step = best_step(q, [p for p in range(k) if p != h])
                    if step is not None:
                        break
        if step is None:
            break
        h, p, i, j = step
        a = int(members[h][i])
        members[h] = np.delete(members[h], i)
        labels[a] = p
        loads[h] -= w[a]
        loads[p] += w[a]
        if j is not None:
            b = int(members[p][j])
            members[p] = np.delete(members[p], j)
            labels[b] = h
            loads[p] -= w[b]
            loads[h] += w[b]
            members[h] = _insert_sorted(w, members[h], b)
        members[p] = _insert_sorted(w, members[p], a)
    return labels


def _insert_sorted(w: np.ndarray, idx: np.ndarray, item: int) -> np.ndarray:
    return np.insert(idx, int(np.searchsorted(w[idx], w[item], side="right")), item)


def _fill_empty(w: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """verl rejects empty partitions: move the lightest item of a partition holding >= 2 items into each empty one.
    That item weighs no more than its old partition's load, so the maximum cannot grow."""
    labels = labels.copy()
    counts = np.bincount(labels, minlength=k)
    for p in np.flatnonzero(counts == 0).tolist():
        donors = np.flatnonzero(counts >= 2)
        if len(donors) == 0:
            break  # fewer items than partitions
        donor = int(donors[np.argmax(counts[donors])])
        idx = np.flatnonzero(labels == donor)
        j = int(idx[np.argmin(w[idx])])
        labels[j] = p
        counts[donor] -= 1
        counts[p] += 1
    return labels


# ---------------------------------------------------------------------------------------------------- helpers


def _as_workloads(workloads) -> np.ndarray:
    if hasattr(workloads, "detach"):  # a torch tensor: go through a list so no torch import is needed here
        workloads = workloads.detach().cpu().tolist()
    w = np.asarray(workloads)
    if w.ndim != 1:
        w = w.reshape(-1)
    if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
        w = w.astype(np.int64)
    else:
        w = w.astype(np.float64)
    if len(w) and w.min() < 0:
        raise ValueError("workloads must be non-negative")
    return w


def _loads(w: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    loads = np.zeros(k, dtype=w.dtype)
    np.add.at(loads, labels, w)
    return loads


def _labels_from_partitions(partitions, n: int, k: int) -> np.ndarray:
    if len(partitions) != k:
        raise ValueError(f"expected {k} partitions, got {len(partitions)}")
    labels = np.full(n, -1, dtype=np.int64)
    for p, part in enumerate(partitions):
        part = np.asarray(list(part), dtype=np.int64)
        if len(part) and (part.min() < 0 or part.max() >= n or np.any(labels[part] != -1)
                          or len(np.unique(part)) != len(part)):
            raise ValueError("partitions must hold every index in range(n) exactly once")
        labels[part] = p
    if np.any(labels < 0):
        raise ValueError("partitions must hold every index in range(n) exactly once")
    return labels


def _partitions_from_labels(w: np.ndarray, labels: np.ndarray, k: int) -> list[list[int]]:
    loads = _loads(w, labels, k)
    order = sorted(range(k), key=lambda p: (-loads[p], p))
    return [np.flatnonzero(labels == p).tolist() for p in order]
