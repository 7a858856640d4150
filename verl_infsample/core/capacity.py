"""Capacity models: how much may decode at once.

``SlotPool`` is the paper's model: at most M samples in flight. ``KVBudget`` is the real constraint: the KV cache
holds the prompt of each group with a sample running, once, plus every running sample's generated tokens. A sample is admitted only
if the projected KV of the running set, every sample ending at its predicted length, never exceeds the budget (the
scheduler never plans past it); if reality outgrows the prediction, the engine must preempt, and the scheduler
counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .sample import Sample


class Ledger(Protocol):
    """What a capacity model may read of the scheduler's state."""

    num_running: int
    kv_tokens: int

    def projected_peak_tokens(self, extra: Sample | None = None) -> int: ...

    def holders(self, extra: Sample | None = None) -> int: ...


@dataclass(frozen=True)
class SlotPool:
    slots: int

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots (M) must be >= 1, got {self.slots}: it is the number of samples decoded at once")

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        return ledger.num_running < self.slots

    def overflows(self, ledger: Ledger) -> bool:
        return False

    def lanes(self, mean_footprint: float) -> int:
        return self.slots

    def __str__(self) -> str:
        return f"slots={self.slots}"


@dataclass(frozen=True)
class KVBudget:
    """``block_size``: an engine that pages its KV in blocks holds up to block_size - 1 unused tokens in the last
    block of every prompt and every sample; the budget charges that slack so the real allocation stays inside it.
    ``max_running``: an engine that also caps how many sequences decode at once (vLLM's ``max_num_seqs``) sets it,
    so the scheduler never admits a sample the engine would leave waiting."""

    tokens: int
    block_size: int = 1
    max_running: int | None = None

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"kv_budget must be >= 1 token, got {self.tokens}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError(f"max_running must be >= 1 (or None: no cap), got {self.max_running}")

    def slack(self, holders: int) -> int:
        return (self.block_size - 1) * holders

    def check_fits(self, prompt_len: int, max_len: int) -> None:
        """A budget must hold at least one worst-case sample, or the rollout could never finish."""
        need = prompt_len + max_len + self.slack(2)
        if need > self.tokens:
            raise ValueError(
                f"kv_budget={self.tokens} tokens cannot hold one sample: the longest prompt ({prompt_len}) plus the "
                f"longest response ({max_len}) needs {need}; raise kv_budget to at least that")

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        if self.max_running is not None and ledger.num_running >= self.max_running:
            return False
        return ledger.projected_peak_tokens(extra=sample) + self.slack(ledger.holders(extra=sample)) <= self.tokens

    def overflows(self, ledger: Ledger) -> bool:
        """Would the next decode step (one token per running sample) exceed the budget?"""
        return ledger.kv_tokens + ledger.num_running + self.slack(ledger.holders()) > self.tokens

    def lanes(self, mean_footprint: float) -> int:
        """How many samples of average (predicted) footprint fit at once: the plan's lane count."""
        lanes = max(1, int(self.tokens // max(1.0, mean_footprint)))
        return lanes if self.max_running is None else min(lanes, self.max_running)

    def __str__(self) -> str:
        return f"kv_budget={self.tokens}"


Capacity = SlotPool | KVBudget
