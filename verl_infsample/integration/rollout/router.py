"""``GroupAffinityRouter``: verl's load balancer, but a GRPO group stays on one replica and groups go by predicted work.

verl's default router (``GlobalRequestLoadBalancer``) sends each request to the replica with the fewest requests in
flight, so the n samples of a prompt spread over every replica: each replica prefills the prompt again and plans
only its share of the group, and the counts it balances say nothing about how long the responses will be.

This router (selected by ``rollout.router_config_path``, see ``verl_infsample.router_config_path()``):

- keeps every request of a group (same ``prompt_ids``) on the replica its first request went to, for as long as
  the group has requests in flight; a request id seen before still goes where it went (verl's sticky sessions);
- sends a new group to the replica with the least *predicted outstanding work*, greedy list scheduling, so the
  replicas finish together rather than hold the same number of requests. A group is booked whole when its first
  request arrives: its expected size (the size it had on its last visit, else the mean size of the groups seen so
  far: GRPO's ``rollout.n``, else 1) x its predicted length. Booking only the requests already arrived would place
  groups by their first sample, and whether a group's siblings arrive before the next group's first request is
  up to the client's timing;
- places the new groups of a burst together, largest predicted work first (LPT): verl's agent loop sends a step's
  requests at once, so a new group's first request waits until no new group has come for ``placement_window_ms``
  (at most 10x that), then every waiting group is placed. Greedy in arrival order would leave the replicas up to
  one group apart, and which group comes last is up to the client's timing; largest-first leaves them at most
  the smallest groups apart, whatever the arrival order. The servers wait for their batch the same way;
- sends a group back to the replica that served its prompt before (where its server's predictor and drafter hold
  the prompt's past: its lengths, its earlier answers) when that replica's booked work is within ``past_slack`` x
  the group's own predicted work of the least-loaded one's; else by load. ``get_status`` reports the share of
  requests that found their prompt's past and the work placed beyond least-loaded;
- predicts a request's length with the core's ``history`` predictor (per-prompt mean of earlier responses, else
  the mean of all, else the same weight for every request: then it balances requests, group by group).

The shipped config selects it on the transformers engine (``router_config_path`` answers None on vLLM, where verl's
own router keeps the replicas' work even and each server orders its own samples). It routes any servers alike.

How it learns lengths: ``release_server`` only gets a request id, so the router asks the servers instead. Either
engine's server of the infinite backend (``transformers.server.InfiniteServer``, ``vllm.server.InfiniteVLLMServer``)
keeps the (prompt key, length) of the samples it finished; the router asks for them
(``pop_finished_lengths``) at most once every ``length_refresh_s`` seconds and takes the answers in on a later call,
never waiting for them (a wait in ``acquire_server`` would pace the arrivals and split the servers' batches). Behind
servers without that method (another backend) it routes on group affinity and request counts alone.

verl builds it as a Ray actor: ``ray.remote(GroupAffinityRouter).remote(servers, yaml_config)``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, fields
from typing import Any

import ray
from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from ...core.predictor import HistoryPredictor
from ...core.sample import Group, Sample, prompt_key

logger = logging.getLogger(__name__)


class RouterConfigError(ValueError):
    pass


@dataclass(frozen=True)
class GroupAffinityConfig:
    """The router yaml's keys (besides verl's ``router_class``)."""

    length_refresh_s: float = 1.0  # collect finished lengths from the servers at most this often
    placement_window_ms: float = 20.0  # new groups wait until none has come for this long, then go largest first
    max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE  # request ids remembered for sticky sessions
    past_slack: float = 0.5  # a group returns to its prompt's replica if that is within this x its work of the least

    @classmethod
    def from_yaml(cls, config: dict | None, source: str = "router config") -> "GroupAffinityConfig":
        config = {k: v for k, v in (config or {}).items() if k != "router_class"}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise RouterConfigError(f"{source}: unknown key {unknown[0]!r}; known keys: router_class, "
                                    f"{', '.join(sorted(known))}")
        c = cls(**config)
        if not isinstance(c.length_refresh_s, (int, float)) or c.length_refresh_s < 0:
            raise RouterConfigError(f"{source}: length_refresh_s={c.length_refresh_s!r} must be a number >= 0")
        if not isinstance(c.placement_window_ms, (int, float)) or c.placement_window_ms < 0:
            raise RouterConfigError(f"{source}: placement_window_ms={c.placement_window_ms!r} must be a number >= 0 "
                                    "(0 places each new group as its first request arrives)")
        if not isinstance(c.past_slack, (int, float)) or c.past_slack < 0:
            raise RouterConfigError(f"{source}: past_slack={c.past_slack!r} must be a number >= 0 (0: always the "
                                    "least-loaded replica)")
        if not isinstance(c.max_cache_size, int) or c.max_cache_size < 1:
            raise RouterConfigError(f"{source}: max_cache_size={c.max_cache_size!r} must be an integer >= 1")
        return c


@dataclass
class _Routed:
    """A request in flight: its group and the work it was booked for."""

    group: str
    server_id: str
    predicted_tokens: float


@dataclass
class _GroupVisit:
    """A group with requests in flight: its replica, the work booked for siblings not arrived yet, and how many
    requests it has had (its size, once the visit ends)."""

    server_id: str
    unclaimed_tokens: float
    inflight: int = 0
    requests: int = 0
    had_past: bool = False  # its prompt was served before ...
    at_past: bool = False  # ... and this visit went back to that replica


@dataclass
class PastRouting:
    """How often requests found their prompt's past, and what that cost in balance."""

    requests_with_past: int = 0  # requests whose prompt a replica had served before
    requests_at_past: int = 0  # ... sent back to that replica
    placed_tokens: float = 0.0  # predicted work of the groups placed
    strayed_tokens: float = 0.0  # booked work of the chosen replica beyond the least-loaded one's, summed

    def report(self) -> dict:
        return {"past_found": self.requests_at_past / self.requests_with_past if self.requests_with_past else None,
                "past_stray": self.strayed_tokens / self.placed_tokens if self.placed_tokens else 0.0,
                "requests_with_past": self.requests_with_past}


class GroupAffinityRouter(GlobalRequestLoadBalancer):
    def __init__(self, servers: dict[str, Any], config: dict | None = None, *, lengths_from_servers: bool = True):
        """``lengths_from_servers=False``: the caller reports finished lengths (``observe_lengths``) instead of the
        router asking the servers (``infsample replay``, whose servers are not Ray actors)."""
        self.config = GroupAffinityConfig.from_yaml(config)
        super().__init__(servers, max_cache_size=self.config.max_cache_size)
        self._predicted_work: dict[str, float] = {sid: 0.0 for sid in servers}  # tokens booked, per replica
        self._visits: dict[str, _GroupVisit] = {}  # groups with requests in flight
        self._group_sizes: dict[str, int] = {}  # group -> its size on its last visit
        self._sizes_seen = [0, 0]  # groups completed, their requests: the mean group size
        self._waiting: dict[str, float] = {}  # new groups waiting for placement -> their predicted work
        self._placed: dict[str, str] = {}  # groups placed, whose requests have not claimed the placement yet
        self._homes: dict[str, str] = {}  # group -> the replica that served its prompt last (most recent last)
        self.past = PastRouting()
        self._placement: asyncio.Future | None = None  # resolves when the waiting groups are placed
        self._last_new_group = 0.0
        self._routed: dict[str, list[_Routed]] = {}  # request id -> its acquisitions in flight
        self._lengths = HistoryPredictor(max_len=1)  # no information: every request weighs the same
        self._learns_lengths = lengths_from_servers
        self._lengths_asked: list[ray.ObjectRef] = []  # pop_finished_lengths calls not answered yet
        self._last_ask = float("-inf")
        self.lengths_learned = 0

    # --- verl's RequestLoadBalancer protocol -----------------------------------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    async def acquire_server(self, request_id: str, prompt_ids=None, **_) -> tuple[str, ray.actor.ActorHandle]:
        if prompt_ids is None:  # a caller that does not send prompts: verl's least-in-flight
            return super().acquire_server(request_id)
        if not self._servers:
            raise RuntimeError("No available servers in load balancer")
        group = prompt_key(prompt_ids)
        predicted = self._predict(group, len(prompt_ids))
        sticky = self._request_id_to_server.get(request_id) in self._servers
        if not sticky and group not in self._visits and group not in self._placed and self.config.placement_window_ms:
            await self._wait_for_placement(group, self._expected_size(group) * predicted)
        return self._route(request_id, group, predicted)

    def _route(self, request_id: str, group: str, predicted: float) -> tuple[str, ray.actor.ActorHandle]:
        """Book ``request_id`` on its replica: where it went before, else where its group is, else by load."""
        visit = self._visits.get(group)
        server_id = self._request_id_to_server.get(request_id)
        if server_id not in self._servers and visit is not None:
            server_id = visit.server_id
        if server_id not in self._servers and visit is None:
            server_id = self._placed.pop(group, None)
        booked = self._expected_size(group) * predicted
        if server_id not in self._servers:
            self._collect_lengths()
            server_id = self._choose(group, booked, self._predicted_work)
        if visit is None or visit.server_id != server_id:  # a new visit (or its replica was removed): book it whole
            if visit is not None:
                self._unbook(visit.server_id, visit.unclaimed_tokens)
            home = self._homes.get(group)
            visit = _GroupVisit(server_id, booked, visit.inflight if visit else 0, visit.requests if visit else 0,
                                had_past=home in self._servers, at_past=home == server_id)
            self._visits[group] = visit
            self._predicted_work[server_id] += booked
            self._homes.pop(group, None)
            self._homes[group] = server_id
            if len(self._homes) > self.config.max_cache_size:
                del self._homes[next(iter(self._homes))]
        self.past.requests_with_past += visit.had_past
        self.past.requests_at_past += visit.at_past
        claimed = min(predicted, visit.unclaimed_tokens)  # a sibling the booking expected ...
        visit.unclaimed_tokens -= claimed
        self._predicted_work[server_id] += predicted - claimed  # ... or one more than expected
        visit.inflight += 1
        visit.requests += 1
        self._request_id_to_server[request_id] = server_id
        self._inflight_requests[server_id] += 1
        self._routed.setdefault(request_id, []).append(_Routed(group, server_id, predicted))
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        super().release_server(server_id, request_id)
        self._collect_lengths()
        routed = self._routed.get(request_id, [])
        done = next((r for r in routed if r.server_id == server_id), None)
        if done is None:
            return
        routed.remove(done)
        if not routed:
            del self._routed[request_id]
        self._unbook(server_id, done.predicted_tokens)
        visit = self._visits.get(done.group)
        if visit is None:
            return
        visit.inflight -= 1
        if visit.inflight == 0:  # the group is done: its next visit is placed by load again
            del self._visits[done.group]
            self._unbook(visit.server_id, visit.unclaimed_tokens)
            self._group_sizes.pop(done.group, None)  # most recent last: the oldest goes first when full
            self._group_sizes[done.group] = visit.requests
            if len(self._group_sizes) > self.config.max_cache_size:
                del self._group_sizes[next(iter(self._group_sizes))]
            self._sizes_seen[0] += 1
            self._sizes_seen[1] += visit.requests

    def add_servers(self, servers: dict[str, ray.actor.ActorHandle]) -> None:
        super().add_servers(servers)
        for sid in servers:
            self._predicted_work[sid] = 0.0

    def remove_servers(self, server_ids: list[str]) -> None:
        super().remove_servers(server_ids)  # groups on a removed replica move with their next request
        for sid in server_ids:
            self._predicted_work.pop(sid, None)

    def get_status(self) -> dict:
        self._collect_lengths()
        return {**super().get_status(), "predicted_tokens": dict(self._predicted_work),
                "groups_in_flight": len(self._visits), "lengths_learned": self.lengths_learned, **self.past.report()}

    def observe_lengths(self, lengths) -> None:
        """(``prompt_key``, length) of finished samples: what the next groups are placed by."""
        for key, length in lengths:
            self._lengths.observe(Group(key, 0, 1), Sample(0, 0, 0, 0), int(length))
        self.lengths_learned += len(lengths)

    # --- routing ---------------------------------------------------------------------------------------------------
    async def _wait_for_placement(self, group: str, work: float) -> None:
        """Join the new groups waiting to be placed; the first to wait places them all once the arrivals pause."""
        self._waiting[group] = max(work, self._waiting.get(group, 0.0))
        self._last_new_group = time.monotonic()
        if self._placement is not None:
            await asyncio.shield(self._placement)
            return
        self._placement = placement = asyncio.get_running_loop().create_future()
        window = self.config.placement_window_ms / 1000
        deadline = self._last_new_group + 10 * window
        try:
            while (now := time.monotonic()) < min(self._last_new_group + window, deadline):
                await asyncio.sleep(min(self._last_new_group + window, deadline) - now)
        finally:  # place them even if this request was cancelled: the others wait on it
            self._place_waiting()
            self._placement = None
            placement.set_result(None)

    def _place_waiting(self) -> None:
        """Largest predicted work first, each to the replica with the least work booked (its booking counted for
        the next group at once, the visit opened when its first request comes back)."""
        waiting, self._waiting = self._waiting, {}
        self._placed = {}  # the last placement's requests have all claimed theirs (or were cancelled)
        if not self._servers:
            return
        booked = dict(self._predicted_work)
        for group, work in sorted(waiting.items(), key=lambda kv: -kv[1]):
            server_id = self._choose(group, work, booked)
            booked[server_id] = booked.get(server_id, 0.0) + work
            self._placed[group] = server_id

    def _choose(self, group: str, work: float, booked: dict[str, float]) -> str:
        """Where a new visit of ``group`` (``work`` predicted) goes, given the work ``booked`` per replica: back to
        its prompt's replica where that is within ``past_slack`` x ``work`` of the least-loaded, else the
        least-loaded (then fewest requests, then the first)."""
        order = {sid: i for i, sid in enumerate(self._servers)}
        least = min(self._servers, key=lambda sid: (booked.get(sid, 0.0), self._inflight_requests.get(sid, 0),
                                                    order[sid]))
        home = self._homes.get(group)
        chosen = least
        if home in self._servers and booked.get(home, 0.0) <= booked.get(least, 0.0) + self.config.past_slack * work:
            chosen = home
        self.past.placed_tokens += work
        self.past.strayed_tokens += booked.get(chosen, 0.0) - booked.get(least, 0.0)
        return chosen

    def _unbook(self, server_id: str, tokens: float) -> None:
        if server_id in self._predicted_work:
            self._predicted_work[server_id] = max(0.0, self._predicted_work[server_id] - tokens)

    def _expected_size(self, group: str) -> int:
        """How many requests a new visit of ``group`` will bring: its last size, else the mean size so far, else 1."""
        if group in self._group_sizes:
            return self._group_sizes[group]
        groups, requests = self._sizes_seen
        return max(1, round(requests / groups)) if groups else 1

    def _predict(self, group: str, prompt_len: int) -> float:
        return self._lengths.predict(Group(group, prompt_len, 1), Sample(0, 0, 0, prompt_len))

    def _collect_lengths(self) -> None:
        """Take in the answers that have arrived; ask again once the last answers are in and the refresh is due."""
        if self._lengths_asked:
            ready, self._lengths_asked = ray.wait(self._lengths_asked, num_returns=len(self._lengths_asked),
                                                  timeout=0)
            for ref in ready:
                try:
                    lengths = ray.get(ref)
                except Exception:  # noqa: BLE001 - a lost server must not stop routing: ask again next refresh
                    logger.warning("GroupAffinityRouter: a server did not report its lengths", exc_info=True)
                    continue
                self.observe_lengths(lengths)
        now = time.monotonic()
        if self._lengths_asked or not self._learns_lengths or now - self._last_ask < self.config.length_refresh_s:
            return
        self._last_ask = now
        try:
            self._lengths_asked = [h.pop_finished_lengths.remote() for h in self._servers.values()]
        except AttributeError:
            logger.warning("GroupAffinityRouter: the servers do not report lengths (not rollout.name=infinite); "
                           "routing by group affinity and request counts only")
            self._learns_lengths = False
