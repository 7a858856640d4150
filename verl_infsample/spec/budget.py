"""How many tokens to draft for a row this step, and whether to propose at all.

While a step verifies fewer than ``step_tokens`` tokens the forward pass is bound by reading the weights, and draft
tokens ride along for free: the rows share that room, so a thin tail (few rows) drafts as long as the trees offer
and a full batch short. Beyond that room a draft token costs compute, and is worth it only when it is likely to be
reached: with a per-token acceptance a, the j-th draft token counts only if the j-1 before it were accepted, so
drafting there stops where a^j falls under ``min_gain``; and a row whose drafts have not been accepted lately
(under ``min_acceptance``) does not propose, trying again every ``retry_every`` steps. Where drafts are free every
row proposes: the proposer's time a row saves by not proposing is small next to what its next accepted run gains
(docs/results.md). A sample predicted to end soon drafts no further than its predicted end.
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
    step_tokens: int = 512  # tokens a step verifies before it turns compute-bound (bf16 weights on an H100: ~300)
    min_gain: float = 0.05  # a draft token is proposed while the chance it is reached stays above this
    min_acceptance: float = 0.05  # below it a row stops proposing ...
    retry_every: int = 8  # ... and tries again after this many steps

    def tokens(self, row: RowAcceptance, *, rows: int, predicted_remaining: int | None = None) -> int:
        """The draft length for ``row`` in a step of ``rows`` decoding rows (0: do not propose)."""
        free = self.step_tokens // max(1, rows) - 1  # draft tokens per row that cost no compute
        if free < 1 and row.rate < self.min_acceptance and row.idle_steps < self.retry_every:
            row.idle_steps += 1
            return 0
        row.idle_steps = 0
        a = min(max(row.rate, 1e-6), 1 - 1e-6)
        likely = math.floor(math.log(self.min_gain) / math.log(a))  # draft tokens likely to be reached
        k = min(self.max_tokens, max(1, free, likely))
        if predicted_remaining is not None:
            k = min(k, max(1, predicted_remaining))
        return k
