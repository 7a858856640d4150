"""A training conversation as the tiny model learns it: segments tokenized on their own, some of them learnt."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """A stretch of a training conversation, tokenized on its own (as verl builds a rollout turn by turn);
    ``learn``: the model is trained to write it (an assistant turn), else it is context (prompt, tool response)."""

    text: str
    learn: bool


@dataclass(frozen=True)
class Dialogue:
    segments: tuple[Segment, ...]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)
