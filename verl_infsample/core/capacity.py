"""Capacity models: how much may decode at once.

``SlotPool`` is the paper's model: at most M samples in flight. ``KVBudget`` is the real constraint: the KV cache
holds the prompt of each group with a sample running, once, plus every running sample's generated tokens. A sample is admitted only
if the projected KV of the running set, every sample ending at its predicted length, never exceeds the budget (the
scheduler never plans past it); if reality outgrows the prediction, the engine must preempt, and the scheduler
counts it. ``PagedKVBudget`` is the same budget in the blocks a paged, prefix-caching engine (vLLM) allocates.
Both also give the skyline plan (``core/skyline.py``) a sample's footprint per step and the budget's ``limit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .sample import Sample


def whole_blocks(tokens, block_size: int):
    """``tokens`` rounded up to whole blocks of ``block_size`` (numbers or numpy arrays)."""
    return -(-tokens // block_size) * block_size


FEW_SAMPLES = 16
"""Sets of up to this many samples are accounted in plain Python, not as arrays: numpy's cost per call, the same at
any size, is most of a small set's accounting (a KV projection makes about 25 calls, ~60 us); measured 2-6x faster
at 4-16 samples, and slower than the arrays past about 20 when whole blocks are charged."""


@dataclass(frozen=True)
class SampleArrays:
    """A set of samples as arrays: what the KV accounting reads. Built once per admission round (the running set
    does not change while candidates are checked, except by the admissions), not once per check: with a few hundred
    samples running, reading their attributes sample by sample for every candidate was most of a step's scheduling."""

    remaining: np.ndarray  # predicted tokens still to decode (``Sample.remaining_predicted``: >= 1)
    generated: np.ndarray
    group: np.ndarray
    prompt_len: np.ndarray

    @classmethod
    def of(cls, samples: list[Sample]) -> "SampleArrays":
        table = np.array([(s.remaining_predicted(), s.generated, s.group, s.prompt_len) for s in samples],
                         dtype=float).reshape(len(samples), 4)  # one pass (exact: the counts are far below 2^53)
        counts = table[:, 1:].astype(np.int64)
        return cls(table[:, 0].copy(), counts[:, 0].copy(), counts[:, 1].copy(), counts[:, 2].copy())

    def plus(self, s: Sample) -> "SampleArrays":
        return SampleArrays(np.append(self.remaining, s.remaining_predicted()), np.append(self.generated, s.generated),
                            np.append(self.group, s.group), np.append(self.prompt_len, s.prompt_len))

    def __len__(self) -> int:
        return len(self.generated)

    def group_prompts(self) -> np.ndarray:
        """Each distinct group's prompt length (groups in ascending order)."""
        _, first = np.unique(self.group, return_index=True)
        return self.prompt_len[first]

    def group_ends(self, remaining: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(each distinct group's prompt length, the most of ``remaining`` over its samples: when the group's last
        sample ends and its prompt goes), groups in ascending order."""
        _, first, which = np.unique(self.group, return_index=True, return_inverse=True)
        ends = np.zeros(len(first), dtype=remaining.dtype)
        np.maximum.at(ends, which, remaining)
        return self.prompt_len[first], ends


class Ledger(Protocol):
    """What a capacity model may read of the scheduler's state."""

    num_running: int
    running: list[Sample]

    def running_arrays(self) -> SampleArrays: ...

    def projected_peak_tokens(self, extra: Sample | None = None, block_size: int = 1) -> int: ...


def running_set(ledger: Ledger, extra: Sample | None = None) -> list[Sample] | SampleArrays:
    """The ledger's running set (plus ``extra``) as the accounting reads it fastest: the samples themselves up to
    ``FEW_SAMPLES`` of them, else the admission round's arrays (``Ledger.running_arrays``)."""
    if ledger.num_running + (extra is not None) <= FEW_SAMPLES:
        return ledger.running if extra is None else [*ledger.running, extra]
    return ledger.running_arrays() if extra is None else ledger.running_arrays().plus(extra)


@dataclass(frozen=True)
class SlotPool:
    slots: int

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots (M) must be >= 1, got {self.slots}: it is the number of samples decoded at once")

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        return ledger.num_running < self.slots

    fits_now = admits

    def overflows(self, ledger: Ledger) -> bool:
        return False

    def lanes(self, mean_footprint: float) -> int:
        return self.slots

    def __str__(self) -> str:
        return f"slots={self.slots}"


@dataclass(frozen=True)
class KVBudget:
    """``block_size``: an engine that pages its KV in blocks (the transformers engine's store) allocates whole
    blocks: a prompt holds ceil(p / block) of them, a sample that feeds its k-th token ceil((k + 1) / block) at most;
    the budget charges whole blocks, so the real allocation stays inside it. ``max_running``: an engine that also
    caps how many sequences decode at once (vLLM's ``max_num_seqs``) sets it, so the scheduler never admits a sample
    the engine would leave waiting."""

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

    def whole_blocks(self, tokens):
        return whole_blocks(tokens, self.block_size)

    def check_fits(self, prompt_len: int, max_len: int) -> None:
        """A budget must hold at least one worst-case sample, or the rollout could never finish."""
        need = self.prompt_footprint(prompt_len) + self.own(prompt_len, max_len - 1)
        if need > self.limit:
            raise ValueError(
                f"{self} cannot hold one sample: the longest prompt ({prompt_len}) plus the longest response "
                f"({max_len}) needs {need} {self.unit}; raise {self.raise_what} to at least that")

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        """The running set's projected peak, ``sample`` included, fits (and the engine's cap on running samples)."""
        return self._below_max_running(ledger) and self.projected_peak(sample, ledger) <= self.limit

    def projected_peak(self, sample: Sample, ledger: Ledger) -> int:
        """Peak use of the running set plus ``sample`` if each ends at its predicted length, in ``limit``'s unit."""
        return ledger.projected_peak_tokens(extra=sample, block_size=self.block_size)

    def _below_max_running(self, ledger: Ledger) -> bool:
        return self.max_running is None or ledger.num_running < self.max_running

    def own(self, prompt_len: int, generated):
        """What a sample that has generated ``generated`` tokens (a number or an array) holds of its own in the step
        that decodes its next token."""
        return self.whole_blocks(generated + 1)

    def in_use(self, running: list[Sample] | SampleArrays, ahead: int = 0) -> int:
        """What the next step (or the one ``ahead`` steps later, if none of them finishes) allocates for
        ``running``; under a budget a group holds its prompt exactly while one of its samples runs."""
        if not isinstance(running, SampleArrays) and len(running) <= FEW_SAMPLES:
            prompts: dict[int, int] = {}
            own = 0
            for s in running:
                own += self.own(s.prompt_len, s.generated + ahead)
                prompts.setdefault(s.group, s.prompt_len)
            return int(own + sum(self.prompt_footprint(p) for p in prompts.values()))
        arrays = running if isinstance(running, SampleArrays) else SampleArrays.of(running)
        if not len(arrays):
            return 0
        return int(self.own(arrays.prompt_len, arrays.generated + ahead).sum()
                   + sum(self.prompt_footprint(int(p)) for p in arrays.group_prompts()))

    def fits_now(self, sample: Sample, ledger: Ledger) -> bool:
        """Admission without reserving growth (the ``plain`` baseline): the next step, ``sample`` included, fits."""
        return self._below_max_running(ledger) and self.in_use(running_set(ledger, sample)) <= self.limit

    def overflows(self, ledger: Ledger) -> bool:
        """Would the next decode step (one token per running sample) exceed the budget?"""
        return self.in_use(running_set(ledger)) > self.limit

    @property
    def limit(self) -> int:
        """The budget in the unit ``footprint`` counts (tokens here, blocks for ``PagedKVBudget``)."""
        return self.tokens

    unit = "tokens"
    raise_what = "kv_budget"

    def footprint(self, prompt_len: int, steps: int) -> np.ndarray:
        """What a fresh sample holds at each of its ``steps`` decode steps, as ``admits`` projects it; the skyline
        plan packs these (``core/skyline.py``)."""
        return self.own(prompt_len, np.arange(steps))

    def prompt_footprint(self, prompt_len: int) -> int:
        """What a group's prompt holds while any of its samples runs."""
        return int(self.whole_blocks(prompt_len))

    def lanes(self, mean_footprint: float) -> int:
        """How many samples of average (predicted) footprint fit at once: the plan's lane count."""
        lanes = max(1, int(self.tokens // max(1.0, mean_footprint)))
        return lanes if self.max_running is None else min(lanes, self.max_running)

    def __str__(self) -> str:
        return f"kv_budget={self.tokens} tokens"


@dataclass(frozen=True, init=False)
class PagedKVBudget(KVBudget):
    """A KV budget counted in the blocks a paged engine with prefix caching allocates (vLLM's), not in tokens.

    Such an engine shares a prompt's full blocks between the samples of its group, except the block that holds the
    prompt's last token (the engine recomputes that token for its logits, so every sample holds its own copy). So
    a group with prompt p holds ``(p - r) / block_size`` shared blocks, r = ((p - 1) % block_size) + 1 being the
    prompt's tail, and a sample that has generated g tokens holds ceil((r + g) / block_size) blocks of its own while
    it decodes its next token (the KV of its last token is computed in that step). Admission charges exactly that,
    projected to the peak over the running set's predicted remaining lengths, so what the core admits is what the
    engine allocates (unlike ``KVBudget``'s whole blocks per prompt and per sample, it knows vLLM shares full prompt
    blocks and keeps the prompt's tail in each sample's first block), and the engine never preempts on its own
    unless a sample outgrows its prediction (then the core preempts first). ``tokens`` is ``blocks * block_size``.
    """

    blocks: int = 0

    def __init__(self, blocks: int, block_size: int, max_running: int | None = None):
        if blocks < 1:
            raise ValueError(f"kv_blocks must be >= 1, got {blocks}")
        object.__setattr__(self, "blocks", blocks)
        super().__init__(blocks * block_size, block_size, max_running)

    def tail(self, prompt_len):
        """Prompt tokens in a sample's own first block (the prompt block it does not share); numbers or arrays."""
        if isinstance(prompt_len, np.ndarray):
            return np.where(prompt_len > 0, (prompt_len - 1) % self.block_size + 1, 0)
        return (prompt_len - 1) % self.block_size + 1 if prompt_len > 0 else 0

    def shared_blocks(self, prompt_len):
        """Whole prompt blocks a group's samples share (the prefix cache); numbers or arrays."""
        return (prompt_len - self.tail(prompt_len)) // self.block_size

    def own(self, prompt_len: int, generated):
        """Blocks of its own a sample holds in the step that decodes its next token."""
        return -(-(self.tail(prompt_len) + generated) // self.block_size)

    @property
    def limit(self) -> int:
        return self.blocks

    def prompt_footprint(self, prompt_len: int) -> int:
        return self.shared_blocks(prompt_len)

    unit = "blocks"
    raise_what = "kv_budget (or the engine's KV blocks)"

    def projected_peak_blocks(self, members: list[Sample] | SampleArrays) -> int:
        """Peak blocks of ``members`` if each ends at its predicted length: every candidate time is a sample's last
        step (between two of them no sample leaves and every sample's blocks only grow)."""
        arrays = members if isinstance(members, SampleArrays) else SampleArrays.of(members)
        if not len(arrays):
            return 0
        bs = self.block_size
        steps = np.ceil(arrays.remaining - 1e-9).astype(np.int64)  # steps still to run
        base = self.tail(arrays.prompt_len) + arrays.generated
        at = np.unique(steps - 1)  # candidate peak times, 0 = the next step
        runs = at[None, :] < steps[:, None]
        own = ((base[:, None] + at[None, :] + bs - 1) // bs * runs).sum(axis=0)
        prompt_lens, group_end = arrays.group_ends(steps)
        shared = self.shared_blocks(prompt_lens)
        prompts = (shared[:, None] * (at[None, :] < group_end[:, None])).sum(axis=0)
        return int(np.max(own + prompts))

    def projected_peak(self, sample: Sample, ledger: Ledger) -> int:
        return self.projected_peak_blocks(ledger.running_arrays().plus(sample))

    def __str__(self) -> str:
        return f"kv_budget={self.blocks} blocks of {self.block_size} tokens"


Capacity = SlotPool | KVBudget
