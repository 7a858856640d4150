"""From arrival to an engine rollout: requests wait until their arrivals pause, then those alike in sampling settings
decode together, as groups (a prompt's samples, one prompt KV for all) whose samples are keyed by stream index.

verl's agent loop sends a prompt's n samples as n separate calls, so a batch closes once a window passes without a
new request (at the latest ``BATCH_WINDOWS_AT_MOST`` windows on); requests that arrive while a rollout decodes join
it by the same rule.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field, fields
from functools import cached_property

from ....core.sample import prompt_key
from ....engines.sampling import SamplingParams

BATCH_WINDOWS_AT_MOST = 10  # a batch starts at the latest this many windows after its first request


@dataclass
class Request:
    """One ``generate`` call, parsed, until its sample's result settles ``future``."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams  # its own, with its response cap as max_new_tokens (seed: see ``seed``)
    seed: int | None  # its own seed, else the rollout's step seed
    logprobs: bool
    session_id: int | None
    future: asyncio.Future = field(repr=False)
    arrived: float = 0.0  # time.monotonic() at arrival

    @cached_property
    def rollout_key(self) -> tuple:
        """Requests alike in these decode in one engine rollout (their sampling settings; response caps may differ).
        Read for every pending request after every decode step (``RequestBatcher.joining``): computed once."""
        return tuple(getattr(self.params, f.name) for f in fields(SamplingParams) if f.name != "max_new_tokens"
                     ) + (self.seed,)

    @property
    def group_key(self) -> tuple:
        """Requests alike in all of these are samples of one group."""
        return (tuple(self.prompt_ids), self.params.max_new_tokens, *self.rollout_key)


@dataclass
class RequestGroup:
    """One group of an engine rollout: its requests in sample-index order and their stream indices."""

    prompt: tuple[int, ...]
    prompt_key: str
    max_tokens: int
    requests: list[Request]
    indices: list[int]


class RequestBatcher:
    """The requests waiting for a rollout, and the sample indices handed out per group in this training step.

    ``generate`` adds requests and ``_drain`` takes a batch, on the event loop; the rollout thread takes the ones
    that join its rollout (``joining``) and groups them (``groups_of``)."""

    def __init__(self, window_s: float):
        self.window = window_s
        self._pending: list[Request] = []
        self._pending_lock = threading.Lock()
        self._issued: dict[tuple, int] = {}

    @property
    def waiting(self) -> int:
        """Requests that arrived and are in no rollout yet."""
        return len(self._pending)

    def add(self, request: Request) -> None:
        with self._pending_lock:
            self._pending.append(request)

    async def arrivals_pause(self) -> None:
        """Return once a window passes without a new request, or ``BATCH_WINDOWS_AT_MOST`` windows from now: a steady
        stream of requests must not hold back the ones already there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BATCH_WINDOWS_AT_MOST * self.window
        while True:
            seen = len(self._pending)
            await asyncio.sleep(self.window)
            if len(self._pending) == seen or loop.time() >= deadline:
                return

    def take_batch(self) -> list[Request]:
        """The next rollout's requests: those alike the oldest waiting one in sampling settings (none if none wait)."""
        with self._pending_lock:
            return self._take(self._pending[0].rollout_key) if self._pending else []

    def take_all(self) -> list[Request]:
        """Every waiting request (abort_all_requests returns them unanswered by the engine)."""
        with self._pending_lock:
            taken, self._pending = self._pending, []
        return taken

    def joining(self, rollout_key: tuple) -> list[Request]:
        """The waiting requests that join the running rollout with these sampling settings, once their arrivals pause
        as a batch's do (within ``BATCH_WINDOWS_AT_MOST`` windows of the first); asked after every decode step."""
        with self._pending_lock:
            alike = [r.arrived for r in self._pending if r.rollout_key == rollout_key]
            if not alike:
                return []
            now = time.monotonic()
            if now - max(alike) < self.window and now - min(alike) < BATCH_WINDOWS_AT_MOST * self.window:
                return []
            return self._take(rollout_key)

    def _take(self, rollout_key: tuple) -> list[Request]:
        """The waiting requests a rollout with these sampling settings decodes (under ``_pending_lock``)."""
        taken = [r for r in self._pending if r.rollout_key == rollout_key]
        self._pending = [r for r in self._pending if r.rollout_key != rollout_key]
        return taken

    def groups_of(self, requests: list[Request]) -> list[RequestGroup]:
        """Requests alike in prompt and sampling settings are one group's samples; groups by prompt, samples by index,
        whatever order the requests came in: the same batch gets the same plan (samples the predictor cannot tell
        apart are planned in position order), so decode steps repeat. A sample's index keys its random stream: its
        session id, else its arrival order within the step."""
        groups: dict[tuple, list[Request]] = {}
        for r in requests:
            groups.setdefault(r.group_key, []).append(r)
        out = []
        for key_of_prompt, key in sorted((prompt_key(k[0]), k) for k in groups):
            reqs = groups[key]
            indices = []
            for r in reqs:
                if r.session_id is not None:
                    indices.append(r.session_id)
                else:
                    indices.append(self._issued.get(key, 0))
                    self._issued[key] = indices[-1] + 1
            if len(set(indices)) != len(indices):
                raise ValueError(f"two requests of one group share a sample index (session_id): {sorted(indices)}")
            by_index = sorted(range(len(reqs)), key=indices.__getitem__)
            out.append(RequestGroup(key[0], key_of_prompt, key[1], [reqs[i] for i in by_index],
                                    [indices[i] for i in by_index]))
        return out

    def new_step(self) -> None:
        """A new training step: sample indices start again at 0 (with a new random key)."""
        self._issued.clear()
