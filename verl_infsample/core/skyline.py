"""The plan under a KV budget: each sample's KV over time, packed into the budget (a memory skyline).

Why not admit whatever fits, longest first? A sample's KV grows by one token per step and peaks at its last step.
Samples of equal length admitted together peak together, so the budget must hold all their peaks at once; when
they end, the next ones again start together (lockstep). Staggered, the same samples are at different ages at any
moment and the budget holds many more of them: with vLLM's 19 blocks of 32 and 96-token answers (a 14-token
prompt), a sample holds 4 blocks at its peak but 2.4 on average, so the budget holds 4 of them in lockstep and
about 7 staggered. So the plan is a time schedule, not an order:

* **footprint**: what a sample holds at each of its steps, as the capacity charges it (``KVBudget.footprint``:
  tokens, or vLLM's blocks); a group's prompt is held while any of its samples runs.
* **placement**: samples longest predicted first (or, with several groups, also tried group after group, longest
  group first, as each group in flight holds its prompt), each at the earliest step where its footprint fits under the
  budget on top of everything placed so far (first fit over time). *Paced* samples (the longest ones) start no
  sooner than ``pacing`` x (area of the previous paced sample / budget) after it: the rate at which the budget
  can absorb them, which staggers their peaks; the shorter samples then fill the gaps.
* **search**: a few pacings (and none) are tried, each followed by compaction (latest-ending first, each sample
  moves to its earliest fit, until nothing moves), and the shortest planned makespan wins; a plan that reaches
  the lower bound (longest sample, or total area / budget) ends the search.
* **improvement** (ruin and recreate): the winner is then refined by small seeded moves: take 1-3 samples out
  (random ones, or a quarter of the time one that ends last and others running beside it), put each back at its
  earliest fit no sooner than its old start plus a random shift of up to one average sample, and keep the move
  if the plan is no longer and its memory sits no later (sum of use x step); undo it otherwise. Pacing staggers
  the long samples at a fixed rate; these moves fix the dips it leaves between them (whole blocks are coarse).
  It stops at the lower bound, after ``IMPROVE_PATIENCE`` moves without a shorter plan, or after
  ``IMPROVE_MOVES``; seeded, so the same input gives the same plan.

The plan never exceeds the budget, so with exact lengths running it admits every sample at its planned step
without a preemption.

At run time (``InfiniteSamplingPolicy``) samples start in planned order, keeping the planned gaps between starts;
a sample that ends before the next planned start may go first (backfill); once fewer or more samples run than the
plan has at that point (predictions met reality), the next samples start as soon as they fit.

Cost: each placement scans candidate starts (pruned by a necessary test, then checked in vectorised
windows), O(ticks scanned x sample ticks). Time is planned in ticks sized so that an average sample spans about
``TICKS_PER_SAMPLE`` of them (1 step per tick for short answers), each tick charged the most its steps hold, so the
plan stays within budget. A batch that would exceed ``MAX_CELLS`` ((samples + groups) x planned ticks) is planned
in coarser ticks, down to ``MIN_TICKS_PER_SAMPLE`` per average sample; beyond that the policy uses the group-major
order. Over all candidate plans at most ``PLACEMENTS`` samples are placed, so big batches try fewer of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_CELLS = 1_000_000  # (samples + groups) x planned ticks above which no skyline is planned (~1 s per 400k here)
PACINGS: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.5, 1.1), (0.6, 1.0), (0.6, 1.1), (0.6, 1.2),
                                            (0.7, 1.1), (0.7, 1.2))
"""(quantile of predicted length above which samples are paced, pacing factor); (0, 0): no pacing."""
COMPACTION_ROUNDS = 3
COMPACT_WITHIN = 1.1
PLACEMENTS = 12_000  # samples placed (built, compacted) over all candidate plans at most: big batches try fewer
IMPROVE_MOVES = 2000  # ruin-and-recreate moves at most (about 0.5 ms each for 64 samples here) ...
IMPROVE_PATIENCE = 600  # ... and at most this many in a row without a shorter plan
AIM_AT_LAST = 0.25  # share of moves that take out a sample ending last (and some beside it), not random ones
TICKS_PER_SAMPLE = 64  # time resolution: an average sample spans this many ticks (1 tick = 1 step for short ones)
MIN_TICKS_PER_SAMPLE = 16  # ... or as few as this, where a big batch would otherwise exceed MAX_CELLS
_NO_CAP = np.iinfo(np.int32).max  # ``max_running`` of an engine without a cap on running samples


class Footprints(Protocol):
    """What the plan needs of a capacity model (``KVBudget``, ``PagedKVBudget``)."""

    limit: int
    max_running: int | None  # an engine's cap on samples decoding at once (vLLM's max_num_seqs), or None

    def footprint(self, prompt_len: int, steps: int) -> np.ndarray: ...

    def prompt_footprint(self, prompt_len: int) -> int: ...


@dataclass(frozen=True)
class SkylinePlan:
    start: np.ndarray  # planned start step of each job, in the order given
    makespan: int
    quantile: float
    pacing: float


class MemorySkyline:
    """Planned use per future step. A group's prompt is charged on the steps where at least one of its samples is
    placed (``held`` counts them); ``running`` counts samples, for an engine that caps them (``max_running``)."""

    WINDOW = 16  # candidate starts tested per vectorised pass

    def __init__(self, limit: int, horizon: int, groups: int, max_running: int | None = None):
        self.limit = limit
        self.max_running = max_running if max_running is not None else _NO_CAP
        self.use = np.zeros(max(1, horizon), dtype=np.int64)
        self.running = np.zeros(max(1, horizon), dtype=np.int32)
        self.held = np.zeros((groups, max(1, horizon)), dtype=np.int32)
        self.end = 0  # one past the last step with anything placed

    def _grow(self, size: int) -> None:
        if size > len(self.use):
            size = max(size, 2 * len(self.use))
            self.running = np.pad(self.running, (0, size - len(self.use)))
            self.use = np.pad(self.use, (0, size - len(self.use)))
            self.held = np.pad(self.held, ((0, 0), (0, size - self.held.shape[1])))

    def earliest_fit(self, footprint: np.ndarray, prompt: int, group: int, not_before: int = 0) -> int:
        """The first step >= ``not_before`` where the footprint (and the prompt, where its group is not held) fits."""
        n, t = len(footprint), max(0, not_before)
        if t >= self.end:
            return t
        self._grow(self.end + n)
        hi = self.end + n - 1  # candidate starts t .. end - 1 (from ``end`` on everything fits)
        use = self.use[t:hi]
        if prompt:  # what the sample would add to each step besides its own footprint
            use = use + prompt * (self.held[group, t:hi] == 0)
        room = self.limit - footprint  # never grows: the footprint never shrinks
        # necessary: no step of the span is fuller than its first step's room or runs max_running samples already,
        # and the last step has the last step's room ...
        blocked = use > room[0]
        if self.max_running != _NO_CAP:
            blocked |= self.running[t:hi] >= self.max_running
        seen = np.cumsum(blocked)  # blocked steps up to each step: a span is clear when none lies within it
        before = np.concatenate(([0], seen[:len(seen) - n]))
        clear = np.flatnonzero((seen[n - 1:] == before) & (use[n - 1:] <= room[-1]))
        # ... then the whole test, on the candidates in order, WINDOW at a time: the first window nearly always holds
        # the fit, so a cheaper pre-filter of every candidate costs more than it prunes
        offsets = np.arange(n)
        for lo in range(0, len(clear), self.WINDOW):
            starts = clear[lo:lo + self.WINDOW]
            ok = np.flatnonzero((use[starts[:, None] + offsets] <= room).all(axis=1))
            if len(ok):
                return t + int(starts[ok[0]])
        return self.end

    def place(self, footprint: np.ndarray, prompt: int, group: int, start: int, sign: int = 1) -> None:
        """Add (``sign=1``) or remove (-1) a sample's footprint starting at ``start``."""
        n = len(footprint)
        self._grow(start + n)
        span = slice(start, start + n)
        held = self.held[group, span]  # views: updated in place
        use = self.use[span]
        held += sign
        if sign > 0:
            use += footprint
            if prompt:  # steps where the group's prompt starts being held
                use += prompt * (held == 1)
        else:
            use -= footprint
            if prompt:  # ... stops being held
                use -= prompt * (held == 0)
        self.running[span] += sign
        if sign > 0:
            self.end = max(self.end, start + n)
        elif start + n >= self.end:  # the last step with anything placed may have been this sample's
            nz = np.flatnonzero(self.running[:self.end])
            self.end = int(nz[-1]) + 1 if len(nz) else 0

    def snapshot(self) -> tuple:
        """The planned use as it stands (copies), for ``restore``: cheaper than placing moved samples back."""
        return self.use.copy(), self.running.copy(), self.held.copy(), self.end

    def restore(self, saved: tuple) -> None:
        self.use, self.running, self.held, self.end = saved

    def late_mass(self) -> int:
        """Sum of use x step: lower when the same memory sits earlier (the improvement's tie-break)."""
        return int(self.use[:self.end] @ np.arange(self.end))


def plan_skyline(lengths: np.ndarray, prompt_lens: np.ndarray, groups: np.ndarray, memory: Footprints,
                 pacings: tuple[tuple[float, float], ...] = PACINGS) -> SkylinePlan | None:
    """Planned start steps for jobs of (predicted) ``lengths`` under ``memory``; None if the instance is too big
    for the skyline (``MAX_CELLS``)."""
    steps = np.maximum(1, np.ceil(lengths - 1e-9).astype(np.int64))
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    rows, mean = len(steps) + n_groups, float(steps.mean())
    coarsest = max(1, math.ceil(mean / MIN_TICKS_PER_SAMPLE))
    if rows * math.ceil(int(steps.max()) / coarsest) > MAX_CELLS:  # the horizon spans at least the longest sample
        return None
    raw = [memory.footprint(int(p), int(s)) for p, s in zip(prompt_lens, steps)]
    prompts = [memory.prompt_footprint(int(p)) for p in prompt_lens]
    group_steps = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(group_steps, groups, steps)
    group_prompt = np.zeros(n_groups, dtype=np.int64)
    group_prompt[groups] = prompt_lens
    prompt_area = sum(memory.prompt_footprint(int(p)) * int(s) for p, s in zip(group_prompt, group_steps))
    shortest = max(int(steps.max()), math.ceil((sum(int(f.sum()) for f in raw) + prompt_area) / memory.limit))
    tick = max(1, math.ceil(mean / TICKS_PER_SAMPLE))  # plan in ticks of this many steps ...
    while rows * (int(math.ceil(shortest / tick) * 1.5) + 1) > MAX_CELLS and tick < coarsest:
        tick = min(coarsest, tick + max(1, tick // 4))  # ... coarser ones for a big batch
    feet = [_in_ticks(f, tick) for f in raw]
    area = sum(int(f.sum()) for f in feet) * tick + prompt_area
    bound = math.ceil(max(int(steps.max()), math.ceil(area / memory.limit)) / tick)  # no plan is shorter
    horizon = int(bound * 1.5) + 1  # grows if needed
    if rows * horizon > MAX_CELLS:
        return None
    steps = np.array([len(f) for f in feet])
    longest_first = np.lexsort((np.arange(len(steps)), -steps))
    group_longest = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(group_longest, groups, steps)
    group_major = np.lexsort((np.arange(len(steps)), -steps, groups, -group_longest[groups]))

    def build(paced_from: float, pacing: float, order: np.ndarray) -> tuple[MemorySkyline, np.ndarray]:
        """Samples in ``order``, each at its earliest fit; those of ``paced_from`` ticks or more paced."""
        sky = MemorySkyline(memory.limit, horizon, n_groups, memory.max_running)
        start = np.zeros(len(steps), dtype=np.int64)
        not_before = 0.0
        for j in order.tolist():
            paced = steps[j] >= paced_from
            t = sky.earliest_fit(feet[j], prompts[j], groups[j], int(not_before) if paced else 0)
            sky.place(feet[j], prompts[j], groups[j], t)
            start[j] = t
            if paced:
                not_before = t + pacing * feet[j].sum() / memory.limit
        return sky, start

    def compact(sky: MemorySkyline, start: np.ndarray) -> int:
        """Latest-ending first, each sample to its earliest fit, until nothing moves (at most a few rounds); returns
        how many placements it made."""
        for rounds in range(1, COMPACTION_ROUNDS + 1):
            moved = 0
            for j in np.argsort(-(start + steps), kind="stable").tolist():
                sky.place(feet[j], prompts[j], groups[j], int(start[j]), sign=-1)
                t = min(int(start[j]), sky.earliest_fit(feet[j], prompts[j], groups[j]))
                sky.place(feet[j], prompts[j], groups[j], t)
                moved += t < start[j]
                start[j] = t
            if not moved:
                break
        return rounds * len(start)

    best = None
    candidates = [(q, p, longest_first) for q, p in pacings]
    if n_groups > 1:  # groups one after another: each group in flight holds its prompt
        candidates.append((0.0, 0.0, group_major))
    placed, built = 0, set()
    for quantile, pacing, order in candidates:
        if best is not None and placed + len(steps) > PLACEMENTS:
            break  # a big batch: the candidates tried so far must do (deterministic, unlike a time limit)
        # candidates that pace the same samples at the same rate build the same plan (ties in the predicted lengths
        # often put several quantiles on one cut): built once; the first of equal plans wins anyway
        paced_from = float(np.quantile(steps, quantile)) if pacing else np.inf
        key = (id(order), pacing, (steps >= paced_from).tobytes())
        if key in built:
            continue
        built.add(key)
        sky, start = build(paced_from, pacing, order)
        placed += len(steps)
        if sky.end > bound and (best is None or sky.end < COMPACT_WITHIN * best[0].end):
            placed += compact(sky, start)  # (compaction gains a few percent: far behind the best, not compacted)
        if best is None or sky.end < best[0].end:
            best = (sky, start, quantile, pacing)
        if sky.end <= bound:
            break  # optimal: nothing to search for
    sky, start, quantile, pacing = best
    if sky.end > bound:
        improve(sky, start, feet, prompts, groups, bound, shift=max(1, int(steps.mean())))
    return SkylinePlan(start * tick, sky.end * tick, quantile, pacing)


def improve(sky: MemorySkyline, start: np.ndarray, feet: list[np.ndarray], prompts: list[int], groups: np.ndarray,
            bound: int, shift: int, seed: int = 0) -> None:
    """Ruin and recreate, in place: moves that leave the plan no longer and its memory no later are kept."""
    rng = np.random.default_rng(seed)
    span = np.array([len(f) for f in feet])
    score = (sky.end, sky.late_mass())
    since_shorter = 0

    for _ in range(IMPROVE_MOVES):
        if sky.end <= bound or since_shorter >= IMPROVE_PATIENCE:
            return
        size = int(rng.integers(1, 4))
        if rng.random() < AIM_AT_LAST:  # one of the samples that end last, and others running beside it
            ends = start + span
            last = int(rng.choice(np.flatnonzero(ends == sky.end)))
            beside = np.flatnonzero(ends > start[last])
            beside = beside[beside != last]
            moved = [last] + rng.choice(beside, size=min(len(beside), size - 1), replace=False).tolist()
        else:
            moved = rng.choice(len(start), size=min(len(start), size), replace=False).tolist()
        old, saved = start[moved], sky.snapshot()
        for j in moved:  # ruin ...
            sky.place(feet[j], prompts[j], groups[j], int(start[j]), sign=-1)
        for j in moved:  # ... and recreate
            shifted = int(start[j]) + int(rng.integers(-shift, shift + 1))
            start[j] = sky.earliest_fit(feet[j], prompts[j], groups[j], shifted)
            sky.place(feet[j], prompts[j], groups[j], int(start[j]))
        new = (sky.end, sky.late_mass())
        if new <= score:
            since_shorter = 0 if new[0] < score[0] else since_shorter + 1
            score = new
            continue
        since_shorter += 1
        sky.restore(saved)  # undo
        start[moved] = old


def _in_ticks(footprint: np.ndarray, tick: int) -> np.ndarray:
    """A footprint per tick of ``tick`` steps: the most it holds within each (so the plan stays within budget)."""
    if tick == 1:
        return footprint
    padded = np.pad(footprint, (0, -len(footprint) % tick), mode="edge")
    return padded.reshape(-1, tick).max(axis=1)
