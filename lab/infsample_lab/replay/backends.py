"""How each backend hands a rollout step's requests to its vLLM replicas: which replica, in what order, at what
priority. What each does is the real code's doing, called here, not re-told:

- ``vllm``: verl 0.9.1's own vLLM rollout. verl's agent loop numbers the batch (its ``priority``, forwarded to vLLM
  for ``rollout.name=vllm``), splits it into ``agent.num_workers`` contiguous chunks, and each worker sends its
  chunk's requests at once, so they reach verl's router one from each worker in turn; verl's
  ``GlobalRequestLoadBalancer`` sends each to the replica with the fewest requests in flight; vLLM runs verl's
  default ``scheduling_policy=fcfs``.
- ``infinite``: ``rollout.name=infinite`` on vLLM. The same agent loop and arrival order (verl forwards no priority
  for another rollout name) and verl's router, as the shipped config has it on vLLM (``router="group_affinity"``:
  our ``GroupAffinityRouter``, each group whole, largest predicted work first); each replica's server orders its
  requests by ``VLLMRequestOrder`` (the plan's priorities from its own predictor, which learns from the samples that
  replica finished) under ``scheduling_policy=priority``. With a predictor that reads tokens (``learned``), or a
  trace's per-sample prediction (``noisy:SIGMA``), each sample runs as the server runs it: a probe of
  ``probe_tokens``, after which its prediction is known (``revealed``), then its rest, held in the server's order
  and released as vLLM has room, ranked by the predictions as they stand then (``held_rests``: the order runs beside
  the replica and learns each sample as it finishes).
- ``oracle``: the ``infinite`` mechanism told each sample's true length at submission (router and priorities, no
  probe): what it would do with exact predictions.
- ``transformers``: ``custom.engine=transformers``, our own engine (``transformers_engine``): ``infinite``'s router,
  then the core scheduler on each replica under the same KV pool and cost model.

``engine`` says where a backend's replicas run: ``vllm`` (vLLM's scheduler) or ``transformers`` (the core's).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np

from verl_infsample.core.sample import prompt_key
from verl_infsample.core.trace import TracePrompt
from verl_infsample.integration.rollout.vllm.probe import PROBE_SUFFIX
from .vllm_replica import ReplayRequest, prompt_token_ids

ROUTERS = ("verl", "group_affinity")  # infinite's router: verl's own (the product's on vLLM), or ours


@dataclass(frozen=True)
class StepSample:
    """One sample of a rollout step, as verl's agent loop sends it."""

    request_id: str
    prompt_id: str
    prompt_tokens: tuple[int, ...]
    batch_position: int  # its prompt's place in verl's batch: the priority verl forwards to vLLM
    uid: int  # its place among all samples of the trace step (seeds the noisy predictor per sample)
    length: int  # its true length (the trace's, capped at the response length)
    opening: tuple[int, ...] = ()  # its first generated ids, where the trace has them (what a probe reads)
    tokens: tuple[int, ...] | None = None  # every id it generated, where the trace has them (drafts check them)


def step_samples(prompts: list[TracePrompt], step: int, max_response_length: int, vocab: int) -> list[StepSample]:
    """A step's samples in verl's batch order: prompt by prompt, each prompt's n samples."""
    out = []
    for pos, p in enumerate(prompts):
        tokens = p.prompt_tokens
        if tokens is None or not all(t < vocab for t in tokens):  # a stand-in, shared by the group's samples
            tokens = prompt_token_ids(p.prompt_id, p.prompt_len, vocab)
        for j, n in enumerate(p.lengths):
            n = min(n, max_response_length)
            out.append(StepSample(f"s{step}-{p.prompt_id}-{j}", p.prompt_id, tokens, pos, len(out), n, p.opening(j),
                                  p.tokens[j][:n] if p.tokens is not None else None))
    return out


def agent_loop_arrivals(samples: list[StepSample], num_workers: int) -> list[StepSample]:
    """The order verl's requests reach its router: the batch in ``num_workers`` contiguous chunks
    (``DataProto.chunk``), every worker sending its chunk in order at once, one request from each worker in turn."""
    chunks = [list(c) for c in np.array_split(np.arange(len(samples)), max(1, num_workers))]
    order = []
    for i in range(max((len(c) for c in chunks), default=0)):
        order += [samples[c[i]] for c in chunks if i < len(c)]
    return order


class VerlVLLMBackend:
    """verl's ``rollout.name=vllm`` (see the module docstring)."""

    name = "vllm"
    engine = "vllm"
    names_groups = False  # its server tells the drafter nothing: siblings are the rows that share a prompt
    scheduling_policy = "fcfs"
    watermark = 0.0  # vLLM's default: nothing kept free at admission

    def __init__(self, replicas: int, seed: int = 0):
        self.replicas = replicas
        self.seed = seed
        self.steps = 0

    def route(self, arrivals: list[StepSample]) -> list[list[ReplayRequest]]:
        from verl.workers.rollout.router import GlobalRequestLoadBalancer

        # verl's balancer breaks ties between equally loaded replicas with the global ``random``: seeded per step
        random.seed(f"replay-{self.seed}-{self.steps}")
        self.steps += 1
        servers = {f"replica{i}": i for i in range(self.replicas)}
        balancer = GlobalRequestLoadBalancer(servers)
        out: list[list[ReplayRequest]] = [[] for _ in range(self.replicas)]
        for s in arrivals:  # every request is in flight at once: none is released while the step is sent
            _, replica = balancer.acquire_server(s.request_id)
            out[replica].append(ReplayRequest(s.request_id, s.prompt_tokens, s.length, priority=s.batch_position,
                                              tokens=s.tokens))
        return out

    def held_rests(self, replica: int) -> None:
        """verl's vLLM server holds nothing back: every request goes into vLLM as it arrives."""

    def observe(self, finished: list[list[tuple[StepSample, int]]]) -> None:
        """verl's vLLM rollout learns nothing from a step."""


class InfiniteBackend:
    """``rollout.name=infinite`` on vLLM, or its oracle (see the module docstring). One instance lives through every
    step of a trace, as the servers and the router live through training."""

    engine = "vllm"
    names_groups = True  # its server names each request's group to the drafter
    scheduling_policy = "priority"
    holds_rests = True  # a probe's rest waits in the replica's order (``held_rests``)

    def __init__(self, replicas: int, predictor: str, max_response_length: int, ordering: str = "longest_first",
                 seed: int = 0, oracle: bool = False, router: str = "group_affinity", probe_tokens: int = 0,
                 max_num_seqs: int = 256):
        from verl_infsample.integration.rollout.vllm.order import VLLMRequestOrder, engine_room
        from verl_infsample.predict import make_predictor
        from .revealed import RevealedByProbe

        self.name = "oracle" if oracle else "infinite"
        self.predictor = "oracle" if oracle else predictor
        self.replicas = replicas
        self.oracle = oracle
        self.knows_truth = oracle or predictor.startswith(("oracle", "noisy"))
        self.max_response_length = max_response_length

        def predictor_of_replica():
            p = make_predictor(self.predictor, seed=seed, max_len=max_response_length)
            if self.knows_truth and not oracle and probe_tokens:  # the trace's prediction, after the probe
                p = RevealedByProbe(p, probe_tokens, max_response_length)
            return p

        self.orders = [VLLMRequestOrder(ordering, predictor_of_replica(), room=engine_room(max_num_seqs))
                       for _ in range(replicas)]
        self._requests: dict[str, object] = {}  # request id -> its OrderedRequest, until it finishes
        self._routed: list[dict[str, object]] = [{} for _ in range(replicas)]  # this step's, by replica
        if router not in ROUTERS:
            raise ValueError(f"unknown --router {router!r}; choose from: {', '.join(ROUTERS)}")
        self.router_name = router
        self.router = self._new_router()
        self._verl_router = VerlVLLMBackend(replicas, seed)
        self.watermark = self.orders[0].engine_watermark()  # as its servers set vLLM's

    def _new_router(self):
        from verl_infsample.integration.rollout.router import GroupAffinityRouter

        logging.getLogger("verl.workers.rollout.router").setLevel(logging.WARNING)
        return GroupAffinityRouter({f"replica{i}": i for i in range(self.replicas)}, lengths_from_servers=False)

    def route(self, arrivals: list[StepSample]) -> list[list[ReplayRequest]]:
        for order in self.orders:
            order.new_step()  # verl's weight sync before the step
        if self.oracle:  # the router books each group by its exact mean length this step
            self.router = self._new_router()
            self.router.observe_lengths([(prompt_key(s.prompt_tokens), s.length) for s in arrivals])
        if self.router_name == "verl":  # verl's balancer: requests spread by requests in flight
            routed = self._verl_router.route(arrivals)
            where = {r.request_id: i for i, reqs in enumerate(routed) for r in reqs}
            placed = [where[s.request_id] for s in arrivals]
        else:
            before = dataclasses.replace(self.router.past)
            placed = asyncio.run(self._acquire_all(arrivals))
            after = self.router.past
            with_past = after.requests_with_past - before.requests_with_past
            placed_tokens = after.placed_tokens - before.placed_tokens
            self.step_past = {  # this step's routing by its prompts' past (StepRow.past_found, past_stray)
                "past_found": round((after.requests_at_past - before.requests_at_past) / with_past, 4)
                if with_past else None,
                "past_stray": round((after.strayed_tokens - before.strayed_tokens) / placed_tokens, 4)
                if placed_tokens else 0.0}
        sizes = Counter(s.prompt_id for s in arrivals)
        out: list[list[ReplayRequest]] = [[] for _ in range(self.replicas)]
        self._routed = [{} for _ in range(self.replicas)]
        for s, replica in zip(arrivals, placed):
            out[replica].append(self._request(self.orders[replica], s, sizes[s.prompt_id]))
            self._routed[replica][s.request_id] = self._requests[s.request_id]
        return out

    def held_rests(self, replica: int):
        """What the worker replaying ``replica`` needs to hold its probes' rests as its server does: the replica's
        order and this step's requests in it (by request id); None where nothing is probed. Where it is not None,
        the worker's order learns the step's samples, and :meth:`adopt` brings it back."""
        order = self.orders[replica]
        return (order, self._routed[replica]) if self.holds_rests and order.probe_tokens else None

    def adopt(self, replica: int, order) -> None:
        """``replica``'s order as it came back from the worker, having learned the step's samples there."""
        self.orders[replica] = order

    def _request(self, order, s: StepSample, group_size: int) -> ReplayRequest:
        """``s`` as its replica's server sends it to vLLM: whole, or its probe with its rest at the priority the probe
        gives it (``VLLMRequestOrder``, the server's own), each telling the drafter what the server tells it
        (``drafter.hints``: the prediction as it stands when the request is sent)."""
        from verl_infsample.drafter.hints import DraftHints
        from verl_infsample.predict.features import TokenWindow

        request = order.arrive(s.prompt_tokens, group_size=group_size, uid=s.uid,
                               true_len=s.length if self.knows_truth else None, max_tokens=self.max_response_length)
        self._requests[s.request_id] = request
        k = order.probe_tokens
        told = dict(arrival=DraftHints().arrive(s.request_id, len(s.prompt_tokens), s.prompt_id),
                    budget=self.max_response_length)
        if not request.probe or s.length <= k:  # whole, or ended within its probe
            return ReplayRequest(s.request_id, s.prompt_tokens, s.length, priority=request.priority,
                                 predicted_len=request.sample.predicted_len, tokens=s.tokens, **told)
        probe_priority, probe_predicted = request.priority, request.sample.predicted_len
        opening = s.opening[:k] if len(s.opening) >= k else (0,) * k  # a trace's prediction needs no tokens
        rest_priority = order.after_probe(request, TokenWindow(opening))
        head, tail = (s.tokens[:k], s.tokens[k:]) if s.tokens is not None else (None, None)
        return ReplayRequest(f"{s.request_id}{PROBE_SUFFIX}", s.prompt_tokens, k, priority=probe_priority,
                             predicted_len=probe_predicted, tokens=head, part="head", **told,
                             rest=ReplayRequest(s.request_id, (), s.length - k, priority=rest_priority,
                                                predicted_len=request.sample.predicted_len, tokens=tail,
                                                part="rest", **told))

    async def _acquire_all(self, arrivals: list[StepSample]) -> list[int]:
        """Every request asks the router at once, as verl's agent-loop workers do (the router waits for the burst
        of new groups, then places them largest first)."""
        tasks = [asyncio.ensure_future(self.router.acquire_server(s.request_id, prompt_ids=list(s.prompt_tokens)))
                 for s in arrivals]
        return [replica for _, replica in await asyncio.gather(*tasks)]

    def observe(self, finished: list[list[tuple[StepSample, int]]]) -> None:
        """Each replica's finished samples, in the order they finished: its server's predictor learns them, the
        router hears of them, and each request's slot in the router is released."""
        for replica, done in enumerate(finished):
            lengths = []
            for s, length in done:
                request = self._requests.pop(s.request_id)
                if self.held_rests(replica) is None:  # else its order learned it beside the replica
                    self.orders[replica].finished(request, length)
                lengths.append((prompt_key(s.prompt_tokens), length))
                self.router.release_server(f"replica{replica}", s.request_id)
            self.router.observe_lengths(lengths)


class TransformersBackend(InfiniteBackend):
    """``custom.engine=transformers`` (see the module docstring): the router's placement, each replica's server
    predictor kept through the trace and handed to the core scheduler, which learns as samples finish."""

    engine = "transformers"
    scheduling_policy = "-"
    holds_rests = False

    def __init__(self, replicas: int, predictor: str, max_response_length: int, seed: int = 0):
        super().__init__(replicas, predictor, max_response_length, seed=seed)
        self.name = "transformers"
        self.predictors = [order.predictor for order in self.orders]

    def observe(self, finished: list[list[tuple[StepSample, int]]]) -> None:
        """The core scheduler's predictor learned each length as it finished; the router hears of them."""
        for replica, done in enumerate(finished):
            for s, _ in done:
                self._requests.pop(s.request_id, None)
                self.router.release_server(f"replica{replica}", s.request_id)
            self.router.observe_lengths([(prompt_key(s.prompt_tokens), length) for s, length in done])


@dataclass(frozen=True)
class BackendSettings:
    """What a replay hands every backend it builds (each takes what it uses)."""

    replicas: int
    predictor: str
    max_response_length: int
    seed: int = 0
    router: str = "group_affinity"
    probe_tokens: int = 0
    max_num_seqs: int = 256


BACKEND_FACTORIES = {
    "vllm": lambda b: VerlVLLMBackend(b.replicas, b.seed),
    "infinite": lambda b: InfiniteBackend(b.replicas, b.predictor, b.max_response_length, seed=b.seed, router=b.router,
                                          probe_tokens=b.probe_tokens, max_num_seqs=b.max_num_seqs),
    "oracle": lambda b: InfiniteBackend(b.replicas, b.predictor, b.max_response_length, seed=b.seed, oracle=True,
                                        router=b.router, probe_tokens=b.probe_tokens, max_num_seqs=b.max_num_seqs),
    "transformers": lambda b: TransformersBackend(b.replicas, b.predictor, b.max_response_length, seed=b.seed),
}
BACKENDS = tuple(BACKEND_FACTORIES)


def make_backend(name: str, replicas: int, predictor: str, max_response_length: int, seed: int = 0,
                 router: str = "group_affinity", probe_tokens: int = 0, max_num_seqs: int = 256):
    """A backend by name (``BACKENDS``)."""
    if name not in BACKEND_FACTORIES:
        raise ValueError(f"unknown --backend {name!r}; choose from: {', '.join(BACKENDS)}")
    return BACKEND_FACTORIES[name](BackendSettings(replicas, predictor, max_response_length, seed, router,
                                                   probe_tokens, max_num_seqs))
