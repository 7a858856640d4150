"""How many tokens to draft for a row this step, and whether to propose at all.

A draft token is worth verifying when it is likely to be reached: with a per-token acceptance a, the k-th draft
token counts only if the k-1 before it were accepted (chance a^(k-1)), so drafting stops where a^k falls under
``min_gain``. Once a step verifies more than ``step_tokens`` tokens the forward pass is compute-bound and every
draft token costs compute: the rows share that room, so a thin tail (few rows) drafts long and a full batch short.
A row whose drafts have not been accepted lately stops proposing (the proposer costs CPU time every step) and tries
again every ``retry_every`` steps. A sample predicted to end soon drafts no further than its predicted end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ACCEPTANCE_PRIOR = 0.5  # a new row's acceptance, before any draft of it was verified
ACCEPTANCE_MEMORY = 0.7  # weight of the past in the running acceptance (per verified step)


@dataclass
class RowAcceptance:
    """One request's recent per-token acceptance, and how long it has gone without proposing."""
    rate: float = ACCEPTANCE_PRIOR
    idle_steps: int = 0

    def verified(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self.rate = ACCEPTANCE_MEMORY * self.rate + (1 - ACCEPTANCE_MEMORY) * accepted / drafted


@dataclass(frozen=True)
class DraftBudget:
    max_tokens: int = 8  # num_speculative_tokens: vLLM reserves this many slots per row
    step_tokens: int = 2048  # tokens a step verifies before it turns compute-bound
    min_gain: float = 0.05  # a draft token is proposed while the chance it is reached stays above this
    min_acceptance: float = 0.1  # below it a row stops proposing ...
    retry_every: int = 8  # ... and tries again after this many steps

    def tokens(self, row: RowAcceptance, *, rows: int, predicted_remaining: int | None = None) -> int:
        """The draft length for ``row`` in a step of ``rows`` decoding rows (0: do not propose)."""
        if row.rate < self.min_acceptance and row.idle_steps < self.retry_every:
            row.idle_steps += 1
            return 0
        row.idle_steps = 0
        k = min(self.max_tokens, max(1, self.step_tokens // max(1, rows) - 1))
        a = min(max(row.rate, 1e-6), 1 - 1e-6)
        k = min(k, max(1, math.floor(math.log(self.min_gain) / math.log(a))))
        if predicted_remaining is not None:
            k = min(k, max(1, predicted_remaining))
        return k
