"""Samples and groups: the units the scheduler moves, with explicit states (as in vLLM's v1 scheduler).

A *group* is one prompt and its G responses (GRPO's group). A *sample* is one response of a group. The prompt's KV
is built when the group's first sample is admitted and shared by all its samples (never copied); it is dropped when
the last one finishes (under a KV budget: as soon as none of them runs). Memory is accounted per open group
(prompt, once) plus per running sample (generated tokens).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field


class SampleState(enum.Enum):
    WAITING = "waiting"  # not admitted yet (or preempted and re-queued)
    RUNNING = "running"  # holds a slot / KV, decodes one token per step
    FINISHED = "finished"  # done: eos, stop or max length


@dataclass(frozen=True)
class Group:
    """One prompt and the number of responses GRPO wants for it."""

    prompt_id: str
    prompt_len: int
    size: int  # G
    max_len: int | None = None  # its responses' cap where it has its own (a later turn's shorter room), else the batch's

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"group {self.prompt_id!r}: size (G) must be >= 1, got {self.size}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"group {self.prompt_id!r}: max_len must be >= 1, got {self.max_len}")
        if self.prompt_len < 0:
            raise ValueError(f"group {self.prompt_id!r}: prompt_len must be >= 0, got {self.prompt_len}")


@dataclass(eq=False)
class Sample:
    """One response of a group. ``uid`` is its position in the whole batch (group-major), stable across policies."""

    uid: int
    group: int  # index of its group in the batch
    index: int  # index within the group, 0..G-1
    prompt_len: int
    predicted_len: float = 0.0  # what the scheduler believes the final length will be
    true_len: int | None = None  # known only to simulators and the oracle predictor
    state: SampleState = SampleState.WAITING
    generated: int = 0  # tokens decoded so far (kept across preemption; its KV is not)
    admitted_at: int = -1  # decode step of the latest admission
    finished_at: int = -1
    preemptions: int = 0
    # the decoding engine's own record (tokens, log-probs, cache handles: ``engines.sample_state``); never read here
    engine_state: object | None = field(default=None, repr=False)

    @property
    def key(self) -> tuple[int, int]:
        return (self.group, self.index)

    def remaining_predicted(self) -> float:
        """Predicted tokens still to decode; never below one while running (it has not finished)."""
        return max(1.0, self.predicted_len - self.generated)


def prompt_key(prompt_ids) -> str:
    """A group's identity: a short hash of its prompt tokens (server, router and replay compute the same one)."""
    return hashlib.blake2b(repr(tuple(int(t) for t in prompt_ids)).encode(), digest_size=8).hexdigest()
