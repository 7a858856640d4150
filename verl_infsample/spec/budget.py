"""How many tokens each row drafts this step, chosen for the whole batch at once.

A step's forward pass is bound by reading the weights while it verifies fewer than ``step_tokens`` tokens; beyond
that it is bound by compute, and its time grows with the tokens it verifies. A row whose drafts are accepted with
per-token probability a gains a^j expected tokens from its j-th draft token (the j-1 before it must be accepted).
:meth:`DraftBudget.plan` takes the draft tokens of every row in order of that gain and stops where the expected
tokens per unit of step time stop growing: while the step stays under ``step_tokens`` every draft token rides along
for free, so a thin tail (few rows) drafts as long as the trees offer; a full batch drafts only its likely tokens,
or none. A row whose drafts are not drafted (a low acceptance in a full batch) does not propose at all, sparing the
proposer's time, and tries one token again every ``retry_every`` steps, so its acceptance stays current. A sample
predicted to end soon drafts no further than its predicted end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ACCEPTANCE_PRIOR = 0.5  # a new row's per-token acceptance, before any draft of it was verified
ACCEPTANCE_MEMORY = 0.7  # weight of the past in the running counts (per verified step)


@dataclass
class RowAcceptance:
    """One request's recent per-token acceptance: accepted draft tokens over tokens tested (the accepted ones and
    the first rejection, where there was one), each a running mean; and how long it has gone without drafting."""

    accepted: float = ACCEPTANCE_PRIOR
    tested: float = 1.0
    idle_steps: int = 0

    @property
    def rate(self) -> float:
        return self.accepted / self.tested if self.tested > 0 else ACCEPTANCE_PRIOR

    def verified(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            tested = accepted + (accepted < drafted)
            self.accepted = ACCEPTANCE_MEMORY * self.accepted + (1 - ACCEPTANCE_MEMORY) * accepted
            self.tested = ACCEPTANCE_MEMORY * self.tested + (1 - ACCEPTANCE_MEMORY) * tested


@dataclass(frozen=True)
class DraftBudget:
    max_tokens: int = 8  # num_speculative_tokens: vLLM reserves this many slots per row
    step_tokens: int = 512  # tokens a step verifies before it turns compute-bound (an 8B model in bf16 on an H100/H200)
    retry_every: int = 8  # steps a row goes without drafting before it tries one token again

    def plan(self, rows: list[RowAcceptance], caps: list[int] | None = None) -> list[int]:
        """Draft tokens for each of a step's decoding ``rows`` (0: do not propose); ``caps[i]``: row i's most
        (its predicted remaining tokens, its room in the model's length)."""
        n = len(rows)
        if n == 0:
            return []
        caps = np.minimum(self.max_tokens, np.maximum(0, np.asarray(caps if caps is not None else
                                                                    [self.max_tokens] * n, dtype=np.int64)))
        if n * (1 + int(caps.max(initial=0))) <= self.step_tokens:  # every draft token rides along for free
            k = caps
        else:
            k = self._best(np.array([r.rate for r in rows]), caps)
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

    def _best(self, rates: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """The draft lengths that maximise expected tokens per step time, step time ``max(1, tokens /
        step_tokens)``: the draft tokens by falling gain, the best prefix of them."""
        n, depth = len(rates), int(caps.max(initial=0))
        if depth == 0:
            return caps
        a = np.clip(rates, 0.0, 1.0)[:, None]
        j = np.arange(1, depth + 1)[None, :]
        gain = np.where(j <= caps[:, None], a ** j, -1.0)  # -1: beyond the row's cap, never taken
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
