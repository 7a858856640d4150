"""How many tokens each row drafts this step, chosen for the whole batch at once.

A step's forward pass is bound by reading the weights while it verifies fewer than ``step_tokens`` tokens; beyond
that it is bound by compute, and its time grows with the tokens it verifies. A row's j-th draft token gains the
probability that it and the j-1 before it are accepted: the row's own acceptance of its first draft token
(:class:`RowAcceptance`) times the batch's acceptance of a token at each later position given the one before it was
accepted (:class:`DepthAcceptance`; on real text a token after an accepted one is accepted far more often than the
first: a draft that matched goes on matching). :meth:`DraftBudget.plan` takes the draft tokens of every row in order
of that gain and stops where the expected tokens per unit of step time stop growing: while the step stays under
``step_tokens`` every draft token rides along for free, so a thin tail (few rows) drafts as long as the trees offer;
a full batch drafts only its likely tokens, or none. A row given no draft tokens (a low acceptance in a full batch)
does not propose at all, sparing the proposer's time, and tries one token again every ``retry_every`` steps, so its
acceptance stays current. Each row's cap comes from its caller (``drafting``: its room in the model, and its
predicted end while it has not outlived it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

ACCEPTANCE_PRIOR = 0.5  # acceptance of a token before any was verified
ACCEPTANCE_MEMORY = 0.7  # weight of a row's past in its running acceptance (per verified step)
DEPTH_MEMORY = 0.998  # weight of the past in the batch's counts by position (per verified row)


@dataclass
class RowAcceptance:
    """One request's recent acceptance of its first draft token (a running mean over the steps it drafted), and how
    long it has gone without drafting."""

    first: float = ACCEPTANCE_PRIOR
    idle_steps: int = 0

    @property
    def rate(self) -> float:
        return self.first

    def verified(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self.first = ACCEPTANCE_MEMORY * self.first + (1 - ACCEPTANCE_MEMORY) * (accepted > 0)


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

    def after_first(self, depth: int) -> np.ndarray:
        """Probability that tokens 2..j are accepted given the first was, for j = 1..``depth`` (1 for j = 1)."""
        accepted, tested = np.zeros(depth), np.zeros(depth)
        known = min(depth, len(self.accepted))
        accepted[:known], tested[:known] = self.accepted[:known], self.tested[:known]
        return np.concatenate(([1.0], np.cumprod((accepted[1:] + ACCEPTANCE_PRIOR) / (tested[1:] + 1.0))))


def accepted_prefix(draft: Sequence[int], output: Sequence[int]) -> int:
    """Draft tokens the rejection sampler kept: the leading ones equal to the row's output tokens."""
    accepted = 0
    while accepted < min(len(draft), len(output)) and int(output[accepted]) == draft[accepted]:
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


@dataclass(frozen=True)
class DraftBudget:
    max_tokens: int = 8  # num_speculative_tokens: vLLM reserves this many slots per row
    step_tokens: int = 512  # tokens a step verifies before it turns compute-bound (an 8B model in bf16 on an H100/H200)
    retry_every: int = 8  # steps a row goes without drafting before it tries one token again

    def plan(self, rows: list[RowAcceptance], caps: list[int] | None = None,
             depth: DepthAcceptance | None = None) -> list[int]:
        """Draft tokens for each of a step's decoding ``rows`` (0: do not propose); ``caps[i]``: row i's most
        (its predicted remaining tokens, its room in the model's length); ``depth``: the batch's acceptance by
        position (None: none verified yet)."""
        n = len(rows)
        if n == 0:
            return []
        caps = np.minimum(self.max_tokens, np.maximum(0, np.asarray(caps if caps is not None else
                                                                    [self.max_tokens] * n, dtype=np.int64)))
        if n * (1 + int(caps.max(initial=0))) <= self.step_tokens:  # every draft token rides along for free
            k = caps
        else:
            k = self._best(np.array([r.rate for r in rows]), caps, depth or DepthAcceptance(self.max_tokens))
        out = []
        for row, ki, cap in zip(rows, k.tolist(), caps.tolist()):
            if ki == 0 and cap > 0:
                row.idle_steps += 1
                if row.idle_steps >= self.retry_every:
                    ki = 1
            if ki > 0:
                row.idle_steps = 0
            out.append(ki)
        return out

    def _best(self, rates: np.ndarray, caps: np.ndarray, accepted_after: DepthAcceptance) -> np.ndarray:
        """The draft lengths that maximise expected tokens per step time, step time ``max(1, tokens /
        step_tokens)``: the draft tokens by falling gain (a row's first-token rate times ``accepted_after``), the
        best prefix of them."""
        n, depth = len(rates), int(caps.max(initial=0))
        if depth == 0:
            return caps
        after_first = accepted_after.after_first(depth)
        reach = np.clip(rates, 0.0, 1.0)[:, None] * after_first[None, :]
        j = np.arange(1, depth + 1)[None, :]
        gain = np.where(j <= caps[:, None], reach, -1.0)  # -1: beyond the row's cap, never taken
        order = np.argsort(-gain, axis=None, kind="stable")
        flat = gain.ravel()[order]
        flat = flat[flat >= 0]
        tokens = n + np.concatenate(([0.0], np.cumsum(flat)))
        verified = n + np.arange(len(flat) + 1)
        per_time = tokens / np.maximum(1.0, verified / self.step_tokens)
        taken = int(np.argmax(per_time))
        k = np.zeros(n, dtype=np.int64)
        np.add.at(k, order[:taken] // depth, 1)
        return k
