"""Capacity models: how much may decode at once.

``SlotPool`` is the paper's model: at most M samples in flight. ``KVBudget`` is the real constraint: the KV cache
holds the prompt of each group with a sample running, once, plus every running sample's generated tokens. A sample is admitted only
if the projected KV of the running set, every sample ending at its predicted length, never exceeds the budget (the
scheduler never plans past it); if reality outgrows the prediction, the engine must preempt, and the scheduler
counts it. ``PagedKVBudget`` is the same budget in the blocks a paged, prefix-caching engine (vLLM) allocates.
Both also give the skyline plan (``core/skyline.py``) a sample's footprint per step and the budget's ``limit``.
``Capacity`` is what every model answers, so that callers ask it rather than check which model they hold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from .sample import Sample


def whole_blocks(tokens, block_size: int):
    """``tokens`` rounded up to whole blocks of ``block_size`` (numbers or numpy arrays)."""
    return -(-tokens // block_size) * block_size


@dataclass(frozen=True)
class SampleArrays:
    """A set of samples as arrays: what the KV accounting reads. Built once per admission round (the running set
    does not change while candidates are checked, except by the admissions), not once per check: reading a few
    hundred samples' attributes for every candidate would cost more than the check itself."""

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


class Capacity:
    """What the scheduler, the plans and the engines ask of any capacity model, so that none of them needs to know
    which model it holds. The defaults answer for a plain count of samples: no memory is charged, so nothing
    overflows and any one sample fits."""

    slots: int | None = None  # samples decoded at once, where a count of them is what binds (else None)
    charges_kv = False  # whether admission charges the KV each sample and prompt holds (memory binds, not a count)

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        """Whether ``sample`` may start now, its growth to its predicted length reserved."""
        raise NotImplementedError

    def fits_now(self, sample: Sample, ledger: Ledger) -> bool:
        """Whether ``sample`` may start now, judged by the next step alone."""
        raise NotImplementedError

    def overflows(self, ledger: Ledger) -> bool:
        """Whether the next decode step would exceed the capacity (then the scheduler preempts)."""
        return False

    def lanes(self, mean_footprint: float) -> int:
        """How many samples of average (predicted) footprint run at once: the plan's lane count."""
        raise NotImplementedError

    def check_fits(self, prompt_len: int, max_len: int) -> None:
        """Raise if one worst-case sample could never run; any sample fits where only a count binds."""

    def with_block_size(self, block_size: int) -> "Capacity":
        """This capacity on an engine that allocates KV in blocks of ``block_size`` tokens."""
        return self


class Unbounded(Capacity):
    """Binds nothing: every sample fits, nothing overflows (``full``'s whole groups at once, whatever memory says)."""

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        return True

    fits_now = admits

    def lanes(self, mean_footprint: float) -> int:
        return 1

    def __str__(self) -> str:
        return "unbounded"


@dataclass(frozen=True)
class SlotPool(Capacity):
    slots: int

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots (M) must be >= 1, got {self.slots}: it is the number of samples decoded at once")

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        return ledger.num_running < self.slots

    fits_now = admits

    def lanes(self, mean_footprint: float) -> int:
        return self.slots

    def __str__(self) -> str:
        return f"slots={self.slots}"


@dataclass(frozen=True)
class KVBudget(Capacity):
    """``block_size``: an engine that pages its KV in blocks (the transformers engine's store) allocates whole
    blocks: a prompt holds ceil(p / block) of them, a sample that feeds its k-th token ceil((k + 1) / block) at most;
    the budget charges whole blocks, so the real allocation stays inside it. ``max_running``: an engine that also
    caps how many sequences decode at once (vLLM's ``max_num_seqs``) sets it, so the scheduler never admits a sample
    the engine would leave waiting."""

    tokens: int
    block_size: int = 1
    max_running: int | None = None

    charges_kv = True

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"kv_budget must be >= 1 token, got {self.tokens}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError(f"max_running must be >= 1 (or None: no cap), got {self.max_running}")

    def whole_blocks(self, tokens):
        return whole_blocks(tokens, self.block_size)

    def with_block_size(self, block_size: int) -> "KVBudget":
        """The same budget charging the whole blocks of ``block_size`` such an engine allocates."""
        return replace(self, block_size=block_size)

    def check_fits(self, prompt_len: int, max_len: int) -> None:
        """A budget must hold at least one worst-case sample, or the rollout could never finish."""
        need = self.prompt_footprint(prompt_len) + self.own(prompt_len, max_len - 1)
        if need > self.limit:
            raise ValueError(
                f"{self} cannot hold one sample: the longest prompt ({prompt_len}) plus the longest response "
                f"({max_len}) needs {need} {self.unit}; raise {self.raise_what} to at least that")

    def admits(self, sample: Sample, ledger: Ledger) -> bool:
        """The running set's projected peak, ``sample`` included, fits (and the engine's cap on running samples)."""
        return (self._below_max_running(ledger)
                and self.projected_peak(ledger.running_arrays().plus(sample)) <= self.limit)

    def _below_max_running(self, ledger: Ledger) -> bool:
        return self.max_running is None or ledger.num_running < self.max_running

    # The KV accounting: what a sample and a prompt hold, now (``in_use``) and at the projected peak
    # (``projected_peak``), in ``limit``'s unit. A subclass changes what one sample and one prompt hold (``_offset``,
    # ``_unit``, ``prompt_footprint``); the sums are these two, for every budget, the scheduler and the plans.
    _unit = 1  # tokens per unit of ``limit``

    def _offset(self, prompt_len):
        """Tokens a sample's own blocks hold besides its generated ones, in the step that decodes its next token:
        here the one being fed."""
        return 1

    def own(self, prompt_len, generated):
        """What a sample that has generated ``generated`` tokens (a number or an array) holds of its own in the step
        that decodes its next token."""
        return self.whole_blocks(self._offset(prompt_len) + generated) // self._unit

    def in_use(self, running: list[Sample] | SampleArrays, ahead: int = 0) -> int:
        """What the next step (or the one ``ahead`` steps later, if none of them finishes) allocates for
        ``running``; under a budget a group holds its prompt exactly while one of its samples runs."""
        arrays = running if isinstance(running, SampleArrays) else SampleArrays.of(running)
        if not len(arrays):
            return 0
        return int(self.own(arrays.prompt_len, arrays.generated + ahead).sum()
                   + self.prompt_footprint(arrays.group_prompts()).sum())

    def projected_peak(self, running: list[Sample] | SampleArrays) -> int:
        """Peak use of ``running`` if each sample ends at its predicted length.

        Usage grows by one token per running sample per step and drops when a sample (or a group's last sample)
        finishes, so the peak is reached in some sample's last step: at step t (0 = the next one) every sample with
        more than t steps left holds ``own(generated + t)``, and every group with such a sample its prompt.
        Admitting against this projection (not against the sum of final lengths) lets short samples use the memory
        long ones have not grown into yet, and still never plans past the budget."""
        arrays = running if isinstance(running, SampleArrays) else SampleArrays.of(running)
        if not len(arrays):
            return 0
        steps = np.ceil(arrays.remaining - 1e-9).astype(np.int64)  # steps still to run (>= 1)
        order = np.argsort(-steps, kind="stable")
        at = steps[order] - 1  # candidate peak times, latest first
        base = (self._offset(arrays.prompt_len) + arrays.generated)[order]
        own = held_in_blocks(base, at, self.block_size) // self._unit
        prompt_lens, group_steps = arrays.group_ends(steps)  # a prompt is held until its group's last sample ends
        latest = np.argsort(-group_steps, kind="stable")
        prompts = np.cumsum(self.prompt_footprint(prompt_lens[latest]))
        held = np.searchsorted(-group_steps[latest], -(at + 1), side="right")  # groups still running at each time
        return int(np.max(own + prompts[held - 1]))

    def fits_now(self, sample: Sample, ledger: Ledger) -> bool:
        """Admission without reserving growth (the ``plain`` baseline): the next step, ``sample`` included, fits."""
        return self._below_max_running(ledger) and self.in_use(ledger.running_arrays().plus(sample)) <= self.limit

    def overflows(self, ledger: Ledger) -> bool:
        """Would the next decode step (one token per running sample) exceed the budget?"""
        return self.in_use(ledger.running_arrays()) > self.limit

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

    def prompt_footprint(self, prompt_len):
        """What a group's prompt (a length or an array of them) holds while any of its samples runs."""
        return self.whole_blocks(prompt_len)

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

    @property
    def _unit(self) -> int:
        return self.block_size

    def _offset(self, prompt_len):
        """The prompt's tail: a sample's own first block holds it."""
        return self.tail(prompt_len)

    @property
    def limit(self) -> int:
        return self.blocks

    def prompt_footprint(self, prompt_len):
        return self.shared_blocks(prompt_len)

    unit = "blocks"
    raise_what = "kv_budget (or the engine's KV blocks)"

    def __str__(self) -> str:
        return f"kv_budget={self.blocks} blocks of {self.block_size} tokens"


_DIRECT_UP_TO = 40  # samples up to which held_in_blocks sums the [m, m] matrix (~40 us either way there; measured)


def held_in_blocks(generated: np.ndarray, at: np.ndarray, block: int) -> np.ndarray:
    """For each candidate time ``at[j]`` (``at`` descending): what the samples still running then (``at[i] >=
    at[j]``) hold, sample i ``whole_blocks(generated[i] + at[j], block)`` tokens.

    Per sample that is block * (q_i + Q + [r_i + R > 0] + [r_i + R > block]), with generated = block * q + r and
    at[j] = block * Q + R, so prefix sums of q and prefix counts of r give every candidate time in O(m * block)
    rather than the [m, m] matrix of every sample at every time (quadratic in the samples running). Up to
    ``_DIRECT_UP_TO`` samples the plain [m, m] sum is cheaper, and is used."""
    m = len(at)
    if m <= _DIRECT_UP_TO:
        return (whole_blocks(generated[:, None] + at[None, :], block) * (at[:, None] >= at[None, :])).sum(axis=0)
    last = np.searchsorted(-at, -at, side="right") - 1  # the last sample still running at at[j] (ties included)
    q, r = np.divmod(generated.astype(np.int64), block)
    at_least = np.zeros((m, block + 1), dtype=np.int64)  # at_least[k, v]: samples i <= k with r_i >= v
    at_least[np.arange(m), r] = 1
    at_least = np.cumsum(np.cumsum(at_least[:, ::-1], axis=1)[:, ::-1], axis=0)
    whole = np.floor(at / block)
    part = at - whole * block
    running = last + 1
    past_start = np.where(part > 0, running, at_least[last, 1])  # r_i + R > 0
    past_end = at_least[last, np.minimum(np.floor(block - part).astype(np.int64) + 1, block)]  # r_i + R > block
    return block * (np.cumsum(q)[last] + running * whole + past_start + past_end)
