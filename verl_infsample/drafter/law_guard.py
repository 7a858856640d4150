"""A check, one step in ``CHECK_EVERY``, that verification keeps the sampled law.

With a point-mass draft (every drafter here proposes tokens, not distributions) the rejection sampler accepts a
draft token with exactly the target's probability of it. So over the draft tokens a step tests (each row's up to
and including its first rejection), the number accepted has mean sum(p) and variance sum(p(1-p)), where p is the
target probability computed here independently of the sampler (its own top-k and top-p, not vLLM's, so that a
fault in vLLM's cannot hide): the request's own temperature, top-k and top-p applied to the raw logits. A broken
sampler (one that verifies with other parameters than the request's) shows as
a gap between the share accepted and the mean p; past ``ALARM_Z`` standard deviations it raises an alarm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALARM_Z = 6.0  # standard deviations of the accumulated gap before the alarm (false alarms ~1e-9 per check)
MIN_TESTED = 200  # draft tokens tested before the gap is judged
POSITIONS_PER_STEP = 16  # draft positions whose target probability is computed per checked step (a vocab softmax)
CHECK_EVERY = 2  # steps: one in so many is checked (the cost bounded; the tally still grows fast enough to see a fault)


@dataclass
class LawTally:
    tested: int = 0
    accepted: int = 0
    expected: float = 0.0  # sum of target probabilities of the tested tokens
    variance: float = 0.0

    def add(self, accepted: bool, p: float) -> None:
        self.tested += 1
        self.accepted += int(accepted)
        self.expected += p
        self.variance += p * (1 - p)

    def merge(self, other: "LawTally") -> None:
        self.tested += other.tested
        self.accepted += other.accepted
        self.expected += other.expected
        self.variance += other.variance

    @property
    def gap(self) -> float:
        """Share of tested draft tokens accepted minus their mean target probability (0 where the law is kept)."""
        return (self.accepted - self.expected) / self.tested if self.tested else 0.0

    @property
    def z(self) -> float:
        return (self.accepted - self.expected) / math.sqrt(self.variance) if self.variance > 0 else 0.0

    @property
    def alarm(self) -> bool:
        return self.tested >= MIN_TESTED and abs(self.z) > ALARM_Z


def rows_to_check(step: int, num_draft_tokens, plain) -> list[int]:
    """The rows whose draft positions this step checks: none but one step in ``CHECK_EVERY``; then whole rows, a
    different share each step, up to ``POSITIONS_PER_STEP`` positions, among those ``plain(i)`` says are sampled
    from temperature, top-k and top-p alone."""
    rows = len(num_draft_tokens)
    if step % CHECK_EVERY or not rows:
        return []
    offset, budget, chosen = (step * 7) % rows, POSITIONS_PER_STEP, []
    for r in range(rows):
        i = (offset + r) % rows
        n = num_draft_tokens[i]
        if n and budget >= n and plain(i):
            chosen.append(i)
            budget -= n
    return chosen


def target_probabilities(logits, temperature, top_k, top_p, tokens):
    """p(token) under the request's own sampling parameters, per draft position (torch tensors, one row each; a
    top-k of 0 or at least the vocabulary, or a top-p of 1, is off). vLLM's rule, written apart from vLLM's code:
    top-k keeps the k largest logits, then top-p keeps the tokens whose more probable tokens hold less than p of the
    top-k distribution."""
    import torch

    logits = logits.to(torch.float32) / temperature.to(torch.float32).unsqueeze(-1)
    vocab = logits.shape[-1]
    if top_k is not None:
        k = top_k.to(torch.long)
        k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
        kth = torch.topk(logits, int(k.max()), dim=-1).values.gather(-1, (k - 1).unsqueeze(-1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        above = torch.cumsum(ordered, dim=-1) - ordered  # the mass of the tokens before each, in that order
        kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, above < top_p.to(torch.float32)
                                                                  .unsqueeze(-1))
        probs = probs * kept
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
