"""Admission by the projected KV peak, in front of an engine that schedules by itself (vLLM).

vLLM admits a waiting request whenever its prompt's blocks are free and, when the running set outgrows the pool,
preempts and later recomputes. The paper's micro groups admit only what the pool holds to the end: a request enters
the engine only while the projected peak of the requests inside it, each growing to its predicted length and the
candidate included (``PagedKVBudget.projected_peak``: vLLM's blocks, a group's full prompt blocks shared), stays
within the pool. The engine still batches, orders (priorities) and preempts as it does; the gate decides only when a
request is handed to it.

The gate does not read the engine's state: a request inside is counted as decoding one token per engine step from
the step it entered (``tick``), as a decoding batch does.
"""

from __future__ import annotations

from dataclasses import dataclass

from .capacity import Capacity, SampleArrays
from .sample import Sample


@dataclass
class GatedRequest:
    """A request as the gate counts it: its group's prompt, its prediction, what it had generated on entry."""

    group_key: str  # its prompt's key: a group's samples share the prompt's full blocks
    prompt_len: int
    predicted_len: float  # the sample's predicted total length (a probe's: its probe tokens)
    generated: int = 0  # tokens of its sample generated before it (a probe's rest: the probe's)


class KVPeakGate:
    """Which requests may enter the engine now (see the module docstring). Answers the ``Ledger`` questions a
    capacity asks about the requests inside."""

    def __init__(self, capacity: Capacity):
        self.capacity = capacity
        self.clock = 0  # engine steps so far
        self._inside: dict[str, tuple[GatedRequest, int]] = {}  # request id -> (request, clock on entry)
        self._groups: dict[str, int] = {}

    def admits(self, request: GatedRequest) -> bool:
        """Whether ``request`` may enter now: the engine is empty (it never idles), or the projected peak with it
        fits."""
        return not self._inside or self.capacity.admits(self._sample(request, self.clock), self)

    def enter(self, request_id: str, request: GatedRequest) -> None:
        self._inside[request_id] = (request, self.clock)

    def leave(self, request_id: str) -> None:
        """``request_id`` finished (or was aborted); unknown ids are ignored (requests that bypassed the gate)."""
        self._inside.pop(request_id, None)
        if not self._inside:
            self._groups.clear()

    def tick(self, steps: int = 1) -> None:
        """``steps`` engine steps ran."""
        self.clock += steps

    # --- the Ledger a capacity reads ------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._inside)

    @property
    def running(self) -> list[Sample]:
        return [self._sample(r, entered) for r, entered in self._inside.values()]

    def running_arrays(self) -> SampleArrays:
        return SampleArrays.of(self.running)

    def _sample(self, r: GatedRequest, entered: int) -> Sample:
        group = self._groups.setdefault(r.group_key, len(self._groups))
        return Sample(0, group, 0, r.prompt_len, predicted_len=r.predicted_len,
                      generated=r.generated + self.clock - entered)
