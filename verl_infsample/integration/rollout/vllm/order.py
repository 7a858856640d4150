"""What ``rollout.name=infinite`` adds to each vLLM request: its place in the plan, its probe, and what the plan
learns when it finishes.

Pure Python (no Ray, no verl, no vLLM): :class:`~.server.InfiniteVLLMServer` holds one and calls it for every
request it serves, and ``infsample replay`` calls the same object for every request it replays, so the replay's
``infinite`` backend is the product's ordering, not a copy of it.

A request arrives (:meth:`VLLMRequestOrder.arrive`) as one sample of its prompt's group. Where the predictor reads
a sample's tokens (``learned``), the sample first runs as a *probe* of ``probe_tokens`` tokens, ahead of every
planned request; its opening then gives the sample a prediction of its own (:meth:`VLLMRequestOrder.after_probe`),
and the rest of it runs at that prediction's place in the plan. Elsewhere a request runs whole at its group's
prediction.

A rest does not wait inside vLLM, where its priority would be fixed when it is sent: it is *held* here
(:meth:`VLLMRequestOrder.hold`) and *released* (:meth:`VLLMRequestOrder.release`) when vLLM has room, that is while
fewer than ``room`` requests are inside it (its running batch and as many waiting: :func:`engine_room`; the server
widens it, :meth:`VLLMRequestOrder.widen`, where vLLM ran short while rests were held), the held rest
ranked first by the predictions as they stand at that moment: a sibling that finished, or a regressor re-fit on the
step's first samples, re-ranks what is still held. The server counts what it sends into vLLM (:meth:`enter`,
:meth:`leave`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ....core.predictor import LengthPredictor
from .priority import StepPriorities
from ....core.sample import Group, Sample, prompt_key
from ....predict.features import TokenWindow

REST_BUFFER = 1.0  # requests let wait inside vLLM beyond its running batch, a share of max_num_seqs


def engine_room(max_num_seqs: int) -> int:
    """Requests let inside a vLLM engine of ``max_num_seqs`` at once: its batch, and as many again waiting, so that
    the slots vLLM frees while the server hears of it and sends the next rests are refilled from what waits inside
    (a round trip through the server can last several engine steps of a small model)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    return max_num_seqs + math.ceil(REST_BUFFER * max_num_seqs)


@dataclass
class OrderedRequest:
    """One request as the plan sees it: its group, its sample, and the priority it runs at."""

    group: Group
    sample: Sample
    priority: int
    probe: bool  # it runs as a probe first (``probe_tokens``), then its rest at ``after_probe``'s priority
    held: int = field(default=-1, compare=False)  # its number among held rests while its rest is held, else -1


class VLLMRequestOrder:
    """Priorities from ``ordering`` (``vllm.priority``) over the lengths ``predictor`` predicts; finished lengths go
    back to the predictor."""

    def __init__(self, ordering: str, predictor: LengthPredictor, probe_tokens: int | None = None,
                 room: int = engine_room(256)):
        """``probe_tokens``: the probe's length; None: the predictor's last token checkpoint where it reads tokens,
        else no probe. ``room``: the requests vLLM holds before rests wait here (:func:`engine_room`)."""
        self.priorities = StepPriorities(ordering)
        self.predictor = predictor
        if probe_tokens is None:
            probe_tokens = max(predictor.token_checkpoints or {0}) if predictor.reads_tokens else 0
        self.probe_tokens = int(probe_tokens)
        if room < 1:
            raise ValueError(f"room must be >= 1 request inside vLLM, got {room}")
        self.room = int(room)
        self.in_engine = 0  # requests sent into vLLM and not yet back
        self._arrived: dict[str, int] = {}  # prompt key -> samples arrived this step
        self._held: dict[int, OrderedRequest] = {}  # held rests by their number
        self._held_groups: dict[str, set[int]] = {}  # prompt key -> its held rests' numbers
        self._queue: list[tuple[int, int]] = []  # (priority, number) of held rests; stale entries skipped
        self._next_number = 0
        self._moved: set[str] = set()  # groups with a finished sample since the last release
        self._revision = predictor.revision()

    def engine_watermark(self) -> float:
        """vLLM's ``watermark`` to run under this order (``Ordering.watermark``): the share of its KV blocks it keeps
        free when it admits a waiting or preempted request, where requests carry predictions of their own."""
        ranks_samples = self.probe_tokens > 0 or self.predictor.tells_samples_apart
        return self.priorities.ordering.watermark(ranks_samples)

    def arrive(self, prompt_ids, group_size: int = 1, uid: int | None = None, true_len: int | None = None,
               max_tokens: int | None = None, may_probe: bool = True) -> OrderedRequest:
        """A request for ``prompt_ids``: one more sample of its prompt's group this step. ``group_size``: the
        samples its group is expected to have (GRPO's ``rollout.n``). ``uid``, ``true_len``: a replay's sample
        number and true length (for the ``oracle`` and ``noisy`` predictors); a live request has neither.
        ``max_tokens``: its budget; one no longer than the probe runs whole, as does one that ``may_probe`` not
        (``probe.probe_refusal``)."""
        key = prompt_key(prompt_ids)
        index = self._arrived.get(key, 0)
        self._arrived[key] = index + 1
        group = Group(key, len(prompt_ids), max(int(group_size), index + 1))
        sample = Sample(uid if uid is not None else index, uid if uid is not None else 0, index, len(prompt_ids),
                        true_len=true_len)
        predicted = sample.predicted_len = self.predictor.predict(group, sample)
        probe = may_probe and self.probe_tokens > 0 and (max_tokens is None or max_tokens > self.probe_tokens)
        if probe:
            priority = self.priorities.probe(key, predicted)
        else:
            priority = self.priorities.of(key, predicted, own=self.predictor.tells_samples_apart)
        return OrderedRequest(group, sample, priority, probe)

    def after_probe(self, request: OrderedRequest, opening: TokenWindow) -> int:
        """The probe of ``request`` decoded ``opening`` and goes on: the priority of its rest, from its own
        prediction."""
        request.sample.generated = len(opening.token_ids)
        self.predictor.observe_tokens(request.group, request.sample, opening)
        request.sample.predicted_len = self.predictor.predict(request.group, request.sample)
        request.priority = self.priorities.of(request.group.prompt_id, request.sample.predicted_len)
        return request.priority

    def finished(self, request: OrderedRequest, length: int) -> str:
        """``request`` completed with ``length`` tokens; returns its prompt's key."""
        self.predictor.observe(request.group, request.sample, length)
        self._moved.add(request.group.prompt_id)
        return request.group.prompt_id

    # --- what is inside vLLM, and the rests held until it has room ----------------------------------------------
    def enter(self) -> None:
        """A request (a probe, or a sample whole) goes into vLLM."""
        self.in_engine += 1

    def leave(self) -> None:
        """A request came back from vLLM (finished, aborted or failed)."""
        self.in_engine -= 1

    def widen(self, by: int) -> None:
        """vLLM ran a step ``by`` slots short with nothing waiting in it while rests were held here: the server's
        round trip outlasts what waits inside vLLM, so ``by`` more requests may be inside it from now on."""
        if by < 1:
            raise ValueError(f"widen by >= 1 request, got {by}")
        self.room += int(by)

    def hold(self, request: OrderedRequest) -> None:
        """``request``'s probe ended (:meth:`after_probe`) and its sample goes on: its rest waits for
        :meth:`release`."""
        request.held, self._next_number = self._next_number, self._next_number + 1
        self._held[request.held] = request
        self._held_groups.setdefault(request.group.prompt_id, set()).add(request.held)
        heapq.heappush(self._queue, (request.priority, request.held))

    @property
    def held(self) -> int:
        """Rests held now."""
        return len(self._held)

    def held_remaining(self) -> list[float]:
        """Each held rest's predicted tokens still to decode, as the predictions stand now."""
        return [r.sample.remaining_predicted() for r in self._held.values()]

    def release(self) -> list[OrderedRequest]:
        """The held rests that go into vLLM now (each counted in), while fewer than ``room`` requests are inside
        it: first in the plan's order by the predictions as they stand now. Re-predicted here: the held rests of
        every group with a sample finished since the last release, and all of them when the predictor's
        ``revision`` moved."""
        out: list[OrderedRequest] = []
        if not self._held or self.in_engine >= self.room:
            return out
        if (revision := self.predictor.revision()) != self._revision:
            self._revision = revision
            self._queue = []
            self._rerank(self._held.values(), every=True)
        else:
            for key in self._moved & self._held_groups.keys():
                self._rerank([self._held[n] for n in self._held_groups[key]])
        self._moved.clear()
        while self._queue and self.in_engine < self.room:
            priority, number = heapq.heappop(self._queue)
            request = self._held.get(number)
            if request is None or request.priority != priority:
                continue  # re-ranked since (its current entry is further down the queue)
            self._unhold(request)
            out.append(request)
            self.in_engine += 1
        return out

    def drop_held(self) -> list[OrderedRequest]:
        """Every held rest, taken out unreleased (an abort: each sample returns its probe's tokens)."""
        out = [self._held[n] for n in sorted(self._held)]
        for r in out:
            self._unhold(r)
        self._queue.clear()
        return out

    def withdraw(self, request: OrderedRequest) -> OrderedRequest | None:
        """``request``'s rest no longer waits (its caller went away): taken out if still held (returned), else
        None."""
        if request.held < 0:
            return None
        self._unhold(request)
        return request

    def _unhold(self, request: OrderedRequest) -> None:
        del self._held[request.held]
        group = self._held_groups[request.group.prompt_id]
        group.discard(request.held)
        if not group:
            del self._held_groups[request.group.prompt_id]
        request.held = -1

    def _rerank(self, requests, every: bool = False) -> None:
        """Re-predict ``requests`` and queue each whose place moved (``every``: each, into an emptied queue)."""
        for r in requests:
            self.predictor.refresh(r.group, r.sample)
            r.sample.predicted_len = self.predictor.predict(r.group, r.sample)
            priority = self.priorities.of(r.group.prompt_id, r.sample.predicted_len)
            if every or priority != r.priority:
                r.priority = priority
                heapq.heappush(self._queue, (priority, r.held))

    def new_step(self) -> None:
        """A new rollout step (verl's weight sync): its groups are counted afresh."""
        self.priorities.new_step()
        self._arrived.clear()
        self._moved.clear()
        self.predictor.start_batch(())
