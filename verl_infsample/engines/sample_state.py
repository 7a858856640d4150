"""What an engine keeps for each sample it decodes, carried by the core as ``Sample.engine_state``.

The core moves samples without reading this; engines and the rollout server read it by attribute. ``DecodeState``
is the response every engine records (and a server answers with); each engine's state adds its own handles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

    from ..core.sample import Sample
    from .torch_sampling import CounterStream

_State = TypeVar("_State", bound="DecodeState")


@dataclass
class DecodeState:
    """A sample's response so far."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # one per token (vLLM: only when the request asks for them)
    finish: str | None = None  # "stop" or "length" once it has finished

    @classmethod
    def of(cls: type[_State], sample: Sample) -> _State:
        """``sample``'s state, typed as the engine that decodes it made it."""
        return sample.engine_state  # type: ignore[return-value]


@dataclass(kw_only=True)
class TransformersSampleState(DecodeState):
    """``TransformersEngine``: the sample's random stream, its own KV blocks, and the first token the lookahead drew
    for it (emitted at its first step, then cleared)."""

    rng: np.random.Generator | CounterStream
    blocks: list[int] = field(default_factory=list)
    first: tuple[int, float] | None = None  # (token, log-prob)
