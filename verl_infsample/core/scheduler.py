"""The scheduler: one loop shared by every engine. Data flows one way: plan -> admit -> step -> retire -> refill.

An engine drives it::

    sched = Scheduler(groups, policy, capacity, predictor, max_len)
    while not sched.done:
        admitted = sched.admit()          # waiting -> running, in the policy's order, within capacity
        preempted = sched.make_room()     # KV budget only: evict (LIFO) if the next step would overflow
        finished = engine.step(sched.running)   # one token for every running sample
        sched.step_done(finished)         # account the step, retire the finished (frees capacity)

The scheduler knows nothing of tokens, tensors or models; engines keep those in ``Sample.engine_state``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .capacity import Capacity, SampleArrays
from .policies import Policy, make_policy
from .predictor import LengthPredictor
from .sample import Group, Sample, SampleState


@dataclass
class SchedulerStats:
    decode_steps: int = 0  # forward passes of the decoding batch, recompute passes included
    recompute_steps: int = 0  # of which: passes spent rebuilding the KV of preempted samples
    prefill_passes: int = 0  # group prompts prefilled (once per group, again only after its KV was dropped)
    recompute_tokens: int = 0  # KV recomputed for preempted samples: the price of a preemption
    preemptions: int = 0
    peak_active: int = 0
    peak_kv_tokens: int = 0
    total_tokens: int = 0
    predict_ms: float = 0.0  # length predictions for the whole batch (first-token lookahead included)
    lookahead_prefills: int = 0  # prompt passes spent drawing first tokens before the plan (one per group)
    plan_ms: float = 0.0  # the policy's global plan (FPTAS, sorting), predictions excluded
    refine_ms: float = 0.0  # the predictor's work while decoding: token features, learning, siblings, outgrown samples
    # (decode step, KV tokens in use) after every step and every change of the running set: memory over time
    kv_timeline: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    def __init__(self, groups: list[Group], policy: Policy, capacity: Capacity, predictor: LengthPredictor,
                 max_len: int, true_lengths: list[list[int]] | None = None,
                 prompt_tokens: list[Sequence[int] | None] | None = None,
                 first_tokens: Callable[[list[Sample]], list] | None = None):
        """``prompt_tokens``: each group's prompt ids where the engine has them, for a predictor that reads prompts
        (its ``observe_prompt`` hook, called before the plan). ``first_tokens``: the engine's first-token lookahead,
        called before the plan when the predictor asks for it (``plans_on_first_token``): every sample's first token
        as a one-token window (e.g. ``predict.TokenWindow``). A group's prompt pass yields the logits of all its
        samples' first tokens, and each sample's random stream fixes which it draws, so one pass per group tells
        the predictor how every sample opens (a direct answer or "let me think step by step") before any of them
        holds a slot: the plan can then order samples *within* a group, not just groups."""
        if max_len < 1:
            raise ValueError(f"max_len (response length) must be >= 1, got {max_len}")
        predictor = policy.predictor_for(predictor)  # what the policy plans on (a baseline: every sample's cap)
        self.policy, self.capacity, self.predictor = policy, capacity, predictor
        self.enforced = policy.enforced(capacity)  # what admission and preemption keep to
        self.fits = policy.admission_rule(self.enforced)  # (sample, this ledger) -> may it start now
        self.max_len = max_len
        self.check_fits(groups)
        self.groups: list[Group] = []
        self.samples: list[Sample] = []
        self.running: list[Sample] = []
        self.kv_tokens = 0
        self._group_running: list[int] = []
        self._group_unfinished: list[int] = []
        self._group_open: list[bool] = []  # admitted once and not all finished: its prompt KV is held
        self._group_first = [0]  # uid of each group's first sample (and one past the last)
        self._open_groups = 0
        self._append(groups, true_lengths)
        # Slots bound the batch, not memory: a started group keeps its prompt KV until its last sample ends, so it
        # is prefilled once however the plan spreads its samples. Under a KV budget memory comes first: an idle
        # group's prompt is dropped and rebuilt when its next sample enters (counted in prefill_passes).
        self._retain_idle_prompts = not capacity.charges_kv
        self._admitting, self._arrays = False, None  # the running set as arrays, during an admission round
        self._finished = 0
        self.stats = SchedulerStats()
        # a predictor with ``observe_tokens`` refines predictions as tokens arrive and siblings finish
        self.refines_predictions = predictor.reads_tokens
        # Predictions are read while decoding only under a KV budget: the admission projection reads the running
        # samples', the SJF refill of what the planned head cannot use the waiting ones'. Under slots, where any
        # sample fits a free slot and a running one keeps its slot until it ends, a waiting sample's prediction is
        # refreshed once, when it is admitted, not each time a sibling finishes, and reports at a running sample's
        # checkpoints only teach the predictor (nothing re-predicts it).
        self._read_while_decoding = capacity.charges_kv
        # a running sample past its predicted length gets a new one before admission projects its growth (KV only)
        self._repredict_outgrown = capacity.charges_kv and predictor.repredicts_outgrown
        # (decode step at which it reaches its prediction, tiebreak, running sample): watched, not scanned each step
        self._outgrowing: list[tuple[int, int, Sample]] = []
        self._tiebreak = itertools.count()
        self._decoded = 0  # decode steps that gave the running samples a token (recompute passes do not)
        # token counts at which engines report a running sample's tokens to it (``observe_tokens``)
        self.token_checkpoints = (reported_checkpoints(predictor, capacity, max_len) if self.refines_predictions
                                  else frozenset())
        self._observe_prompts(groups, prompt_tokens)
        predictor.start_batch(groups)
        self.lookahead = (first_tokens is not None and self.refines_predictions
                          and predictor.plans_on_first_token)
        if self.lookahead:
            self._look_ahead(first_tokens, self.samples)
        # Under slots a sample's prediction is read only by the plan; it is refreshed at admission (siblings as of
        # then) for the predictor's record of the sample, except after a lookahead, which made the plan's
        # predictions from the first tokens: they are the sample's record (the plan saw no finished siblings).
        self._refresh_on_admission = (self.refines_predictions and not self._read_while_decoding
                                      and not self.lookahead)
        self._plan()

    def check_fits(self, groups: list[Group]) -> None:
        """Every group's worst-case sample must fit the capacity (a KV budget may be too small for one), or the
        rollout could never finish."""
        for g in groups:
            if g.max_len is not None and g.max_len > self.max_len:
                raise ValueError(f"group {g.prompt_id!r}: max_len {g.max_len} exceeds the batch's {self.max_len}")
        for prompt_len, cap in sorted({(g.prompt_len, g.max_len or self.max_len) for g in groups}):
            self.enforced.check_fits(prompt_len, cap)

    def _append(self, groups: list[Group], true_lengths: list[list[int]] | None) -> list[Sample]:
        """``groups`` join the batch (at its start, or while it decodes): their samples, waiting, and their ledgers."""
        new = []
        for gi, g in enumerate(groups, start=len(self.groups)):
            for i in range(g.size):
                true = true_lengths[gi - len(self.groups)][i] if true_lengths is not None else None
                new.append(Sample(uid=len(self.samples) + len(new), group=gi, index=i, prompt_len=g.prompt_len,
                                  true_len=true))
            self._group_first.append(self._group_first[-1] + g.size)
        self.groups.extend(groups)
        self.samples.extend(new)
        self._group_running.extend(0 for _ in groups)
        self._group_unfinished.extend(g.size for g in groups)
        self._group_open.extend(False for _ in groups)
        return new

    def _observe_prompts(self, groups: list[Group], prompt_tokens: list[Sequence[int] | None] | None) -> None:
        if prompt_tokens is not None:
            for g, tokens in zip(groups, prompt_tokens):
                if tokens is not None:
                    self.predictor.observe_prompt(g.prompt_id, [int(t) for t in tokens])

    def _look_ahead(self, first_tokens: Callable[[list[Sample]], list], samples: list[Sample]) -> None:
        t0 = time.perf_counter()
        windows = first_tokens(samples)
        if len(windows) != len(samples):
            raise RuntimeError(f"first_tokens returned {len(windows)} windows for {len(samples)} samples")
        for s, window in zip(samples, windows):
            self.predictor.observe_tokens(self.groups[s.group], s, window)
        self.token_checkpoints -= {1}  # every sample's first token is known now: no need to report it again
        self.stats.lookahead_prefills += len({s.group for s in samples})
        self.stats.predict_ms += (time.perf_counter() - t0) * 1e3

    # --- arrivals while decoding (streaming) --------------------------------------------------------------------
    def add_groups(self, groups: list[Group], *, true_lengths: list[list[int]] | None = None,
                   prompt_tokens: list[Sequence[int] | None] | None = None,
                   first_tokens: Callable[[list[Sample]], list] | None = None) -> list[Sample]:
        """Groups that arrive while the batch decodes join it: their samples are predicted as the first ones were
        (the first-token lookahead included) and the policy plans them into the running schedule
        (``Policy.extend``: the running samples' predicted ends hold their lanes). A group the capacity can never
        hold is refused before anything changes. Returns the new samples, waiting."""
        self.check_fits(groups)
        new = self._append(groups, true_lengths)
        self._observe_prompts(groups, prompt_tokens)
        self.predictor.join_batch(groups)
        if self.lookahead and first_tokens is not None:
            self._look_ahead(first_tokens, new)
        t1 = time.perf_counter()
        for s in new:
            s.predicted_len = self._predicted_len(s)
        t2 = time.perf_counter()
        waiting = [s for s in self.samples if s.state is SampleState.WAITING]
        footprint = (sum(s.predicted_len for s in waiting) + sum(self.groups[g].prompt_len for g in
                                                                 {s.group for s in waiting})) / max(1, len(waiting))
        busy = sorted(s.remaining_predicted() for s in self.running)
        self.policy.extend(new, self.capacity.lanes(footprint), busy=busy,
                           memory=self.capacity if self.capacity.charges_kv else None)
        self.stats.predict_ms += (t2 - t1) * 1e3
        self.stats.plan_ms += (time.perf_counter() - t2) * 1e3
        return new

    # --- plan -------------------------------------------------------------------------------------------------
    def _plan(self) -> None:
        t0 = time.perf_counter()
        for s in self.samples:
            s.predicted_len = self._predicted_len(s)
        t1 = time.perf_counter()
        mean_footprint = (sum(s.predicted_len for s in self.samples) + sum(g.prompt_len for g in self.groups)) / max(
            1, len(self.samples))
        self.policy.plan(list(self.samples), self.capacity.lanes(mean_footprint),
                         memory=self.capacity if self.capacity.charges_kv else None)
        self.stats.predict_ms += (t1 - t0) * 1e3
        self.stats.plan_ms = (time.perf_counter() - t1) * 1e3

    # --- refining predictions while decoding -------------------------------------------------------------------
    def observe_tokens(self, reports: list[tuple[Sample, tuple]]) -> None:
        """Samples that reached one of ``token_checkpoints`` this step, each with its tokens as plain numbers (e.g.
        ``predict.TokenWindow``): the predictor reads them, and a sample whose prediction changed gets the new one
        where something reads it (under a KV budget: the KV projection and the SJF refill)."""
        if not self.refines_predictions:
            return
        t0 = time.perf_counter()
        changed = [s for s, window in reports if self.predictor.observe_tokens(self.groups[s.group], s, window)]
        if not self._read_while_decoding:
            changed = [s for s in changed if s.state is SampleState.WAITING]
        self._repredict(changed)
        self.stats.refine_ms += (time.perf_counter() - t0) * 1e3

    def _predict_outgrown(self) -> None:
        """Running samples that reached their predicted length and go on get the predictor's new estimate (otherwise
        the projection has them end at the next step and admits into memory they will still grow into). The time
        counts as the predictor's."""
        t0 = time.perf_counter()
        due = self._outgrowing
        while due and due[0][0] <= self._decoded:
            s = heapq.heappop(due)[2]  # (an entry of a preempted or re-predicted sample may be stale: checked)
            if s.state is SampleState.RUNNING and s.generated >= s.predicted_len:
                s.predicted_len = max(s.generated + 1.0, min(float(self._cap(s)),
                                                             self.predictor.predict_outgrown(self.groups[s.group], s)))
                self._watch(s)
        self.stats.refine_ms += (time.perf_counter() - t0) * 1e3

    def _watch(self, s: Sample) -> None:
        """Running ``s`` will reach its predicted length at a known step (it gains a token per decode step): note
        it, so that ``_predict_outgrown`` looks at it then (each time its prediction changes)."""
        if self._repredict_outgrown:
            due = self._decoded + max(0, math.ceil(s.predicted_len - s.generated))
            heapq.heappush(self._outgrowing, (due, next(self._tiebreak), s))

    def _cap(self, s: Sample) -> int:
        """The longest ``s`` may grow: its group's own cap, else the batch's."""
        return self.groups[s.group].max_len or self.max_len

    def _predicted_len(self, s: Sample) -> float:
        return float(min(self._cap(s), self.predictor.predict(self.groups[s.group], s)))

    def _repredict(self, samples: list[Sample]) -> None:
        changed = []
        for s in samples:
            new = self._predicted_len(s)
            if new != s.predicted_len:
                s.predicted_len = new
                changed.append(s)
                if s.state is SampleState.RUNNING:
                    self._watch(s)
        if changed:  # (the policy keeps what it had for the others)
            self.policy.predictions_changed([s for s in changed if s.state is SampleState.WAITING])

    # --- ledger (read by the capacity model) --------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    def running_arrays(self) -> SampleArrays:
        """The running set as arrays; built once per admission round (while ``admit`` checks candidates the running
        set changes only by its own admissions, which it appends), else fresh."""
        if self._arrays is not None:
            return self._arrays
        arrays = SampleArrays.of(self.running)
        if self._admitting:
            self._arrays = arrays
        return arrays

    def holds_prompt(self, group: int) -> bool:
        """Whether ``group``'s prompt KV is held now (engines free it when this turns False)."""
        return self._group_open[group]

    # --- the loop -----------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._finished == len(self.samples)

    def admit(self) -> list[Sample]:
        if self._outgrowing and self._outgrowing[0][0] <= self._decoded:  # a running sample reached its prediction
            self._predict_outgrown()
        fits = lambda s: self.fits(s, self)  # noqa: E731
        admitted = []
        self._admitting, self._arrays = True, None
        try:
            while (s := self.policy.select(fits, self.stats.decode_steps)) is not None:
                self._start(s)
                admitted.append(s)
        finally:
            self._admitting, self._arrays = False, None
        if not self.running and not self.done:  # an empty engine never idles: the policy's first sample starts now
            s = self.policy.select_when_idle(fits, self.stats.decode_steps)
            if s is not None:
                self._start(s)
                admitted.append(s)
        if not self.running and not self.done:
            raise RuntimeError(f"policy {self.policy.name!r} admitted nothing with the engine empty and "
                               f"{len(self.samples) - self._finished} samples waiting under {self.capacity}: "
                               "the capacity cannot hold the next sample")
        if admitted:
            self._record_peaks()
            self.stats.kv_timeline.append((self.stats.decode_steps, self.kv_tokens))
        return admitted

    def _start(self, s: Sample) -> None:
        """``s`` (chosen by the policy) joins the running set."""
        if s.state is not SampleState.WAITING:
            raise RuntimeError(f"policy {self.policy.name!r} admitted sample {s.key} in state {s.state.value}")
        if not self._group_open[s.group]:
            self._group_open[s.group] = True
            self._open_groups += 1
            self.stats.prefill_passes += 1  # the group's prompt KV is built once for all its samples
            self.kv_tokens += s.prompt_len
        if s.generated:  # a preempted sample: its generated tokens' KV is recomputed
            self.stats.recompute_tokens += s.generated
            self.kv_tokens += s.generated
        if self._refresh_on_admission and self._finished:
            t0 = time.perf_counter()
            s.predicted_len = self._predicted_len(s)
            self.stats.refine_ms += (time.perf_counter() - t0) * 1e3
        s.state, s.admitted_at = SampleState.RUNNING, self.stats.decode_steps
        self._watch(s)
        self._group_running[s.group] += 1
        self.running.append(s)
        if self._arrays is not None:
            self._arrays = self._arrays.plus(s)

    def make_room(self) -> list[Sample]:
        """Preempt the latest admitted samples until the next step fits the budget (never the last one)."""
        preempted: list[Sample] = []
        while len(self.running) > 1 and self.enforced.overflows(self):
            s = self.running.pop()
            self._release(s)
            s.state = SampleState.WAITING
            s.preemptions += 1
            self.stats.preemptions += 1
            self.policy.requeue(s)
            preempted.append(s)
        return preempted

    def charge_recompute(self, steps: int) -> None:
        """The engine spent ``steps`` forward passes rebuilding preempted samples' KV: they count as steps."""
        self.stats.decode_steps += steps
        self.stats.recompute_steps += steps

    def step_done(self, finished: list[Sample], steps: int = 1) -> None:
        """``steps`` decode steps ran (each gave every running sample one token); ``finished`` ended on the last."""
        self.stats.decode_steps += steps
        self._decoded += steps
        for s in self.running:
            s.generated += steps
        self.kv_tokens += steps * len(self.running)
        self.stats.total_tokens += steps * len(self.running)
        self._record_peaks()
        self.stats.kv_timeline.append((self.stats.decode_steps, self.kv_tokens))
        if finished:
            learn_s = 0.0
            done = {id(s) for s in finished}
            self.running = [s for s in self.running if id(s) not in done]
            for s in finished:
                self._group_unfinished[s.group] -= 1
                self._release(s)
                s.state, s.finished_at = SampleState.FINISHED, self.stats.decode_steps
                self._finished += 1
                self.policy.on_retire(s)
                t0 = time.perf_counter()
                self.predictor.observe(self.groups[s.group], s, s.generated)
                learn_s += time.perf_counter() - t0
                self.stats.kv_timeline.append((self.stats.decode_steps, self.kv_tokens))
            t0 = time.perf_counter()
            if self.refines_predictions and self._read_while_decoding:  # sibling signal: finished lengths
                # inform the rest of their groups (under slots, at their admission: see __init__)
                for g in sorted({s.group for s in finished}):
                    if self._group_unfinished[g] > self._group_running[g]:  # (some of it still waits)
                        members = self.samples[self._group_first[g]:self._group_first[g + 1]]
                        self._repredict([s for s in members if s.state is SampleState.WAITING])
            if self.refines_predictions:
                self.stats.refine_ms += (time.perf_counter() - t0 + learn_s) * 1e3  # learning included

    def _release(self, s: Sample) -> None:
        """``s`` leaves the running set (finished or preempted); its group's prompt goes when the group closes."""
        self.kv_tokens -= s.generated
        g = s.group
        self._group_running[g] -= 1
        idle = self._group_running[g] == 0 and not self._retain_idle_prompts
        if self._group_open[g] and (self._group_unfinished[g] == 0 or idle):
            self._group_open[g] = False
            self._open_groups -= 1
            self.kv_tokens -= s.prompt_len

    def _record_peaks(self) -> None:
        st = self.stats
        st.peak_active = max(st.peak_active, len(self.running))
        st.peak_kv_tokens = max(st.peak_kv_tokens, self.kv_tokens)

    def results(self) -> list[list[Sample]]:
        """Every sample of every group, each exactly once, in (group, index) order."""
        if not self.done:
            raise RuntimeError("the rollout has not finished: refusing to return partial groups")
        out: list[list[Sample]] = [[] for _ in self.groups]
        for s in self.samples:
            out[s.group].append(s)
        return out


def reported_checkpoints(predictor: LengthPredictor, capacity: Capacity, max_len: int) -> frozenset[int]:
    """Token counts at which engines report a running sample's tokens to a predictor that reads them: its
    ``token_checkpoints`` (default: every token), or under M slots, where nothing reads a running sample's
    prediction, its ``slot_checkpoints`` where it has them."""
    if not capacity.charges_kv and predictor.slot_checkpoints is not None:
        return frozenset(predictor.slot_checkpoints)
    if predictor.token_checkpoints is not None:
        return frozenset(predictor.token_checkpoints)
    return frozenset(range(1, max_len + 1))


def build_scheduler(groups: list[Group], policy: str, capacity: Capacity, predictor: LengthPredictor,
                    max_len: int, *, fptas_eps: float = 0.02,
                    true_lengths: list[list[int]] | None = None,
                    prompt_tokens: list[Sequence[int] | None] | None = None,
                    first_tokens: Callable[[list[Sample]], list] | None = None) -> Scheduler:
    """A ``Scheduler`` for a policy by name (``predict.make_predictor`` builds a predictor by spec; the policy says
    which it plans on: ``Policy.predictor_for``). Under M slots naive's rounds hold M."""
    pol = make_policy(policy, slots=capacity.slots, fptas_eps=fptas_eps)
    return Scheduler(groups, pol, capacity, predictor, max_len, true_lengths=true_lengths, prompt_tokens=prompt_tokens,
                     first_tokens=first_tokens)
