"""How many tokens each row drafts this step, chosen for the whole batch at once, by what a step costs.

A step's seconds, as the budget weighs them (:class:`StepCost`): a fixed part (the weights read once, the rows' KV, the
host's scheduling), a part for each verified token (its GEMMs: about 20 us on an H100 for an 8B model), and the
proposer's time for each row that drafts. A row's j-th draft token gains the probability that it and the j-1 before it
are accepted: the row's acceptance of its first draft token (:class:`RowAcceptance`: its own verdicts weighed against
the batch's, so that a rejection or two, likely at any rate, does not stop a row the batch says pays) times the batch's
acceptance of a token at each later position given the one before it was accepted (:class:`DepthAcceptance`; on real
text a token after an accepted one is accepted far more often than the first: a draft that matched goes on matching).
:meth:`DraftBudget.plan` picks the draft lengths that maximise the step's expected tokens per second: a thin tail (few
rows, a step's fixed part dominant) drafts as long as the trees offer; a full batch drafts only the tokens likely enough
to pay for their GEMMs and the proposer's time, or none. A row given no draft tokens does not propose at all, sparing
the proposer's time, and tries one token again every ``retry_every`` steps, so its acceptance stays current. Each row's
cap comes from its caller (``drafting``: its room in the model, and its predicted end while it has not outlived it).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

ACCEPTANCE_PRIOR = 0.5  # acceptance of a token before any was verified
ACCEPTANCE_MEMORY = 0.7  # weight of a row's past verdicts against its newest (per verified step)
ROW_PRIOR_WEIGHT = 4.0  # the batch's first-token acceptance counts as this many verdicts of a row's own
DEPTH_MEMORY = 0.998  # weight of the past in the batch's counts by position (per verified row)
# A verified token's GPU seconds per model parameter (on the worker's shard): the token GEMMs' 2 FLOPs a parameter at
# an H100's / H200's dense bf16 peak (989 TFLOP/s) and the token efficiency the step model is fitted to (0.75;
# docs/step_model.md): 20 us a token for Llama-3.1-8B. On other GPUs it scales with their peak.
VERIFY_S_PER_PARAM = 2 / (989e12 * 0.75)
STEPS_REMEMBERED = 16  # steps whose seconds give the fixed part (their median: an idle gap between steps is an outlier)
STEPS_BEFORE_PRICING = 4  # wall-clock steps timed before the fixed part is trusted (the first hold warm-up; a
# stand-in runner's take no time): until then drafts cost nothing
PROPOSER_MEMORY = 0.7  # weight of the past in the proposer's running time a row (per step that proposed)


@dataclass
class RowAcceptance:
    """One request's recent verdicts on its first draft token (counts decayed per step it drafted), and how long it
    has gone without drafting."""

    accepted: float = 0.0
    tested: float = 0.0
    idle_steps: int = 0

    def rate(self, batch: float) -> float:
        """Its first token's acceptance: its own verdicts beside ``ROW_PRIOR_WEIGHT`` of the batch's rate ``batch``.
        At 0.3 a token most rows see a rejection soon; on its own verdicts alone such a row would stop drafting."""
        return (self.accepted + ROW_PRIOR_WEIGHT * batch) / (self.tested + ROW_PRIOR_WEIGHT)

    def verified(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self.accepted = ACCEPTANCE_MEMORY * self.accepted + (accepted > 0)
            self.tested = ACCEPTANCE_MEMORY * self.tested + 1


class DepthAcceptance:
    """The batch's acceptance of a draft token at each position given the one before it was accepted: running counts
    over every row's verdicts (tested: positions up to and including the first rejection)."""

    def __init__(self, max_tokens: int):
        self.accepted = np.zeros(max_tokens)
        self.tested = np.zeros(max_tokens)

    def verified(self, drafted, accepted) -> None:
        """A step's verdicts: ``drafted[i]`` draft tokens of a row, ``accepted[i]`` of them accepted (rows that
        drafted nothing are skipped)."""
        drafted, accepted = np.asarray(drafted, dtype=np.int64), np.asarray(accepted, dtype=np.int64)
        accepted, tested = accepted[drafted > 0], np.minimum(drafted, accepted + 1)[drafted > 0]
        if len(tested) == 0:
            return
        positions = np.arange(len(self.accepted))
        decay = DEPTH_MEMORY ** len(tested)
        self.accepted = self.accepted * decay + (accepted[:, None] > positions).sum(axis=0)
        self.tested = self.tested * decay + (tested[:, None] > positions).sum(axis=0)

    def first(self) -> float:
        """The batch's acceptance of a first draft token."""
        return float((self.accepted[0] + ACCEPTANCE_PRIOR) / (self.tested[0] + 1.0)) if len(self.tested) else \
            ACCEPTANCE_PRIOR

    def after_first(self, depth: int) -> np.ndarray:
        """Probability that tokens 2..j are accepted given the first was, for j = 1..``depth`` (1 for j = 1)."""
        accepted, tested = np.zeros(depth), np.zeros(depth)
        known = min(depth, len(self.accepted))
        accepted[:known], tested[:known] = self.accepted[:known], self.tested[:known]
        return np.concatenate(([1.0], np.cumprod((accepted[1:] + ACCEPTANCE_PRIOR) / (tested[1:] + 1.0))))


def accepted_prefix(draft: Sequence[int], output: Sequence[int]) -> int:
    """Draft tokens the rejection sampler kept: the leading ones equal to the row's output tokens."""
    accepted = 0
    for drafted, sampled in zip(draft, output):
        if drafted != sampled:
            break
        accepted += 1
    return accepted


class AcceptanceRecord:
    """What the rejection sampler said of the drafts so far: each running row's :class:`RowAcceptance` and the
    batch's :class:`DepthAcceptance`, which :meth:`DraftBudget.plan` reads."""

    def __init__(self, max_tokens: int):
        self.rows: dict[Hashable, RowAcceptance] = {}
        self.depth = DepthAcceptance(max_tokens)

    def row(self, req_id: Hashable) -> RowAcceptance:
        return self.rows.setdefault(req_id, RowAcceptance())

    def forget(self, req_id: Hashable) -> None:
        self.rows.pop(req_id, None)

    def verified(self, req_ids: Sequence[Hashable], drafts: Sequence[Sequence[int]],
                 outputs: Sequence[Sequence[int]]) -> list[int]:
        """A step's verdicts: row i drafted ``drafts[i]`` and its output tokens are ``outputs[i]``; returns the
        draft tokens each row had accepted (0 where it drafted nothing)."""
        accepted, verdicts = [], []
        for req_id, draft, output in zip(req_ids, drafts, outputs):
            a = accepted_prefix(draft, output) if draft else 0
            accepted.append(a)
            if draft:
                verdicts.append((len(draft), a))
                if req_id in self.rows:
                    self.rows[req_id].verified(len(draft), a)
        if verdicts:
            self.depth.verified(*zip(*verdicts))
        return accepted


@dataclass
class StepCost:
    """A step's seconds as the budget weighs drafts: ``fixed_s + token_s * verified + row_s * drafting`` (verified:
    every decoding row's sampled token and its draft tokens; drafting: the rows that proposed). ``token_s`` is given
    (:data:`VERIFY_S_PER_PARAM` times the model's parameters); ``row_s`` and ``fixed_s`` are learnt from the proposer's
    own time (:meth:`proposed`) and the steps' seconds (:meth:`step_took`), wall-clock in a run, modeled in the
    replay. Until ``trusted_after`` steps are timed the fixed part is taken as large: drafts cost nothing (modeled
    seconds are exact from the first step)."""

    token_s: float = 0.0
    row_s: float = 0.0
    trusted_after: int = STEPS_BEFORE_PRICING
    _fixed: deque = field(default_factory=lambda: deque(maxlen=STEPS_REMEMBERED), repr=False)
    _fixed_s: float | None = field(default=None, repr=False)  # their median, once trusted

    @property
    def steps_timed(self) -> int:
        return len(self._fixed)

    @property
    def fixed_s(self) -> float | None:
        return self._fixed_s

    @property
    def free(self) -> bool:
        """Whether a draft token costs nothing yet (the fixed part untrusted, or nothing else priced)."""
        return self._fixed_s is None or (self.token_s == 0 and self.row_s == 0)

    def seconds(self, verified: float, drafting: float) -> float:
        fixed = self._fixed_s if self._fixed_s is not None else 1e9
        # a step the clock saw take no time still takes some
        return max(fixed + self.token_s * verified + self.row_s * drafting, 1e-12)

    def step_took(self, seconds: float, verified: int, drafting: int) -> None:
        """A step that verified ``verified`` tokens, ``drafting`` rows having proposed, took ``seconds``."""
        self._fixed.append(max(0.0, seconds - self.token_s * verified - self.row_s * drafting))
        if len(self._fixed) >= max(1, self.trusted_after):
            self._fixed_s = statistics.median(self._fixed)

    def proposed(self, seconds: float, drafting: int) -> None:
        """The proposer spent ``seconds`` drafting for ``drafting`` rows (a running mean a row)."""
        if drafting > 0:
            per_row = seconds / drafting
            self.row_s = per_row if self.row_s == 0 else PROPOSER_MEMORY * self.row_s + (1 - PROPOSER_MEMORY) * per_row


@dataclass
class DraftBudget:
    max_tokens: int = 8  # num_speculative_tokens: vLLM reserves this many slots per row
    cost: StepCost = field(default_factory=StepCost)
    retry_every: int = 8  # steps a row goes without drafting before it tries one token again
    planned: tuple[int, int] = (0, 0)  # the last plan's tokens to verify and rows that propose

    def step_took(self, seconds: float) -> None:
        """The step that verified the last plan's drafts took ``seconds``, its proposing included."""
        if self.planned[0] > 0:
            self.cost.step_took(seconds, *self.planned)

    def plan(self, rows: list[RowAcceptance], caps: list[int] | None = None,
             depth: DepthAcceptance | None = None) -> list[int]:
        """Draft tokens for each of a step's decoding ``rows`` (0: do not propose); ``caps[i]``: row i's most
        (its predicted remaining tokens, its room in the model's length); ``depth``: the batch's acceptance by
        position (None: none verified yet)."""
        n = len(rows)
        if n == 0:
            self.planned = (0, 0)
            return []
        caps = np.minimum(self.max_tokens, np.maximum(0, np.asarray(caps if caps is not None else
                                                                    [self.max_tokens] * n, dtype=np.int64)))
        if self.cost.free:
            k = caps
        else:
            depth = depth or DepthAcceptance(self.max_tokens)
            batch = depth.first()
            k = self._best(np.array([r.rate(batch) for r in rows]), caps, depth)
        out = []
        for row, ki, cap in zip(rows, k.tolist(), caps.tolist()):
            if ki == 0 and cap > 0:
                row.idle_steps += 1
                if row.idle_steps >= self.retry_every:
                    ki = 1
            if ki > 0:
                row.idle_steps = 0
            out.append(ki)
        self.planned = (n + sum(out), sum(1 for ki in out if ki > 0))
        return out

    def _best(self, rates: np.ndarray, caps: np.ndarray, accepted_after: DepthAcceptance) -> np.ndarray:
        """The draft lengths that maximise expected tokens per second (:class:`StepCost`), by Dinkelbach's method:
        at a rate ``lam`` (tokens a second) each row takes the length whose expected tokens less ``lam`` times its
        seconds is largest, which gives a better rate, until none does (exact for a ratio over a finite set)."""
        n, depth = len(rates), int(caps.max(initial=0))
        if depth == 0:
            return caps
        reach = np.clip(rates, 0.0, 1.0)[:, None] * accepted_after.after_first(depth)[None, :]
        lengths = np.arange(depth + 1)
        gained = np.concatenate((np.zeros((n, 1)), np.cumsum(reach, axis=1)), axis=1)  # expected tokens of length k
        gained[lengths[None, :] > caps[:, None]] = -np.inf  # beyond the row's cap: never taken
        seconds = self.cost.token_s * lengths + self.cost.row_s * (lengths > 0)  # a length's own seconds
        best, rate = np.zeros(n, dtype=np.int64), n / self.cost.seconds(n, 0)
        for _ in range(32):
            k = np.argmax(gained - rate * seconds[None, :], axis=1)
            better = (n + gained[np.arange(n), k].sum()) / self.cost.seconds(n + k.sum(), np.count_nonzero(k))
            if better <= rate * (1 + 1e-12):
                break
            best, rate = k, better
        return best


class DraftPlanner:
    """A drafter's budget and what it learns from: how many tokens each row drafts this step (:meth:`plan`), the
    rejection sampler's verdicts (:meth:`verified`), what a step took (:meth:`step_took`). ``cost``: what a step
    costs (None: drafts cost nothing until steps are timed and tokens priced)."""

    def __init__(self, max_tokens: int, cost: StepCost | None = None):
        self.budget = DraftBudget(max_tokens=max_tokens, cost=cost if cost is not None else StepCost())
        self.acceptance = AcceptanceRecord(max_tokens)

    @property
    def cost(self) -> StepCost:
        return self.budget.cost

    def plan(self, req_ids: Sequence[Hashable], caps: list[int]) -> list[int]:
        """Draft tokens for each of a step's decoding rows ``req_ids`` (0: do not propose), ``caps[i]`` at most."""
        return self.budget.plan([self.acceptance.row(r) for r in req_ids], caps, self.acceptance.depth)

    def verified(self, req_ids: Sequence[Hashable], drafts: Sequence[Sequence[int]],
                 outputs: Sequence[Sequence[int]]) -> list[int]:
        """A step's verdicts (:meth:`AcceptanceRecord.verified`): the draft tokens each row had accepted."""
        return self.acceptance.verified(req_ids, drafts, outputs)

    def step_took(self, seconds: float) -> None:
        """The step that verified the last plan's drafts took ``seconds``, its proposing included."""
        self.budget.step_took(seconds)

    def forget(self, req_id: Hashable) -> None:
        """``req_id`` left (or starts afresh under the same id)."""
        self.acceptance.forget(req_id)
