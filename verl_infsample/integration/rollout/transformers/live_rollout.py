"""One engine rollout's requests, seen from the rollout thread: its groups in the engine's order, growing as
requests join while it decodes, and each request's answer, handed to the event loop that awaits it (once).
"""

from __future__ import annotations

import asyncio
from typing import Callable

from ....engines.base import Arrivals
from ....engines.sample_state import DecodeState
from .batching import Request, RequestGroup


class LiveRollout:
    """The requests of one engine rollout, as groups join it; answers them on the server's event loop (each once)."""

    def __init__(self, first: list[Request], loop: asyncio.AbstractEventLoop):
        self.first, self.loop = first, loop
        self.key = first[0].rollout_key
        self.members: list[RequestGroup] = []  # the engine's groups, in its order
        self.joined = 0  # requests that joined while it decoded
        self._answered: set[int] = set()  # id() of the requests answered (verl's request ids need not be unique)
        self._joiners: list[Request] = []

    def requests(self) -> list[Request]:
        return [*self.first, *self._joiners]

    def join(self, requests: list[Request], groups_of: Callable[[list[Request]], list[RequestGroup]]
             ) -> Arrivals | None:
        """``requests`` join the running rollout as the groups ``groups_of`` makes of them: what the engine takes
        (``Arrivals``), or None when they cannot be grouped. Either way a failure is theirs alone: their requests
        are answered with it and the rollout goes on."""
        self._joiners.extend(requests)
        try:
            groups = groups_of(requests)
        except ValueError as e:
            for r in requests:
                self.answer(r, error=e)
            return None
        base = len(self.members)
        self.members.extend(groups)
        self.joined += len(requests)

        def refuse(error: Exception) -> None:
            del self.members[base:]
            for r in requests:
                self.answer(r, error=ValueError(f"request {r.request_id}: {error}"))
        return Arrivals([list(g.prompt) for g in groups], [len(g.indices) for g in groups],
                        [g.prompt_key for g in groups], [g.indices for g in groups],
                        [g.max_tokens for g in groups], refuse)

    def answer(self, r: Request, result: tuple | None = None, error: BaseException | None = None) -> None:
        """From the rollout thread: ``r``'s result (or error), once."""
        if id(r) in self._answered:
            return
        self._answered.add(id(r))
        self.loop.call_soon_threadsafe(_settle, r.future, result, error)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():  # (abort_all_requests answered it)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class RolloutAborted(Exception):
    """Raised in the rollout thread once ``abort_all_requests`` asks; carries the scheduler (None: never started)."""

    def __init__(self, sched):
        super().__init__("rollout aborted by abort_all_requests")
        self.sched = sched


def aborted_results(members: list[RequestGroup], sched) -> list[tuple[Request, tuple]]:
    """Every request of an aborted engine rollout: its tokens so far, "completed" if its sample had finished."""
    by_group: dict[int, list] = {}
    for s in sorted(sched.samples, key=lambda s: s.key) if sched is not None else []:
        by_group.setdefault(s.group, []).append(s)
    results = []
    for g, group in enumerate(members):
        samples = by_group.get(g, [None] * len(group.requests))
        for r, s in zip(group.requests, samples):
            if s is None:
                results.append((r, ([], [], 0, "aborted")))
            else:
                state = s.engine_state if isinstance(s.engine_state, DecodeState) else DecodeState()
                results.append((r, (list(state.tokens), list(state.logprobs), s.preemptions,
                                    "completed" if state.finish is not None else "aborted")))
    return results
