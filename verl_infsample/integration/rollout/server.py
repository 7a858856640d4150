"""``InfiniteServer``: the Ray actor verl's agent loop sends requests to.

verl's agent loop sends a prompt's n samples as n separate ``generate`` calls. The server collects the requests
that arrive within a short window, recognises a group by its prompt tokens (one prompt KV for all its samples),
and plans them with the Infinite Sampling scheduler on the transformers engine (``build_engine``). Requests that
arrive while that rollout decodes join it after the next step (streaming: their groups are planned into the running
schedule, ``Scheduler.add_groups``), so a freed slot is refilled from them too and a multi-turn agent's next turn
need not wait for the others' turns. Every request gets exactly one ``TokenOutput``, as soon as its sample finishes;
if the engine fails, every request in flight fails with it.

``abort_all_requests`` / ``resume_generation`` follow verl's vLLM server: abort closes a gate, returns queued
requests with stop_reason "aborted", stops the decoding batch at its next step (unfinished samples return their tokens
so far, "aborted") and returns only once nothing decodes, so new weights can be loaded safely.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from ...core.sample import prompt_key
from ...engines.sample_state import DecodeState
from ...engines.sampling import SamplingParams
from ..settings import choose_dtype, config_value, settings_from_rollout

logger = logging.getLogger(__name__)
SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # what the engine's sleep mode frees (vLLM's wake_up tags)
FINISHED_LENGTHS_KEPT = 1 << 16  # (prompt key, length) pairs kept for a router to collect (pop_finished_lengths)
BATCH_WINDOWS_AT_MOST = 10  # a batch starts at the latest this many windows after its first request
REQUESTS_IN_FLIGHT = 1 << 16
"""Calls a rollout server takes at once. verl's agent loop sends every sample of a step as its own call and each
waits until its sample is decoded, so a step has n x prompts calls in flight (64 x 512 = 32768); a call past the actor's
limit would wait in Ray, unseen by the plan (verl's own replicas allow 1000)."""


# The sampling parameters the transformers engine's server honours, with vLLM's meaning (``engines.sampling``); any
# other key is refused by name, never dropped.
HONOURED_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "max_new_tokens", "min_tokens", "logprobs",
                 "stop_token_ids", "ignore_eos", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "logit_bias")
LOGIT_BIAS_LIMIT = 100.0  # vLLM clamps a logit bias to [-100, 100]


@dataclass(frozen=True)
class RolloutDefaults:
    """What a request that does not say takes from verl's rollout config, as verl's vLLM server does."""

    ignore_eos: bool = False  # rollout.ignore_eos
    repetition_penalty: float = 1.0  # rollout.repetition_penalty
    seed: int | None = None  # rollout.seed + the replica's rank with rollout.full_determinism, else none


@dataclass
class _Request:
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
        Read for every pending request after every decode step (``_joining``): computed once."""
        return tuple(getattr(self.params, f.name) for f in fields(SamplingParams) if f.name != "max_new_tokens"
                     ) + (self.seed,)

    @property
    def group_key(self) -> tuple:
        """Requests alike in all of these are samples of one group."""
        return (tuple(self.prompt_ids), self.params.max_new_tokens, *self.rollout_key)


@dataclass
class _RequestGroup:
    """One group of an engine rollout: its requests in sample-index order and their stream indices."""

    prompt: tuple[int, ...]
    prompt_key: str
    max_tokens: int
    requests: list[_Request]
    indices: list[int]


class _LiveRollout:
    """The requests of one engine rollout, as groups join it; answers them on the server's event loop (each once)."""

    def __init__(self, first: list[_Request], loop: asyncio.AbstractEventLoop):
        self.first, self.loop = first, loop
        self.key = first[0].rollout_key
        self.members: list[_RequestGroup] = []  # the engine's groups, in its order
        self.joined = 0  # requests that joined while it decoded
        self._answered: set[int] = set()  # id() of the requests answered (verl's request ids need not be unique)
        self._joiners: list[_Request] = []

    def requests(self) -> list[_Request]:
        return [*self.first, *self._joiners]

    def note_joined(self, requests: list[_Request]) -> None:
        self._joiners.extend(requests)

    def answer(self, r: _Request, result: tuple | None = None, error: BaseException | None = None) -> None:
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


def request_sampling(sampling_params: dict, request_id: str, *, max_new_tokens: int, eos: tuple[int, ...],
                     vocab_size: int, defaults: RolloutDefaults) -> tuple[SamplingParams, int | None]:
    """A request's sampling parameters as the engine takes them (with ``max_new_tokens``, its response cap, and seed 0)
    and its own seed (None: the rollout's). Every key the engine cannot honour, and every bad value, is refused by
    name: the error fails this request alone."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"request {request_id}: {why}")

    if unknown := sorted(k for k, v in sampling_params.items() if k not in HONOURED_KEYS and v is not None):
        raise refuse(f"sampling parameter {unknown[0]!r} is not supported by the transformers engine (it honours "
                     f"{', '.join(HONOURED_KEYS)}); drop it, or decode with actor_rollout_ref.rollout.custom."
                     "engine=vllm (verl's vLLM server, which takes every vLLM sampling parameter)")
    sp = {k: v for k, v in sampling_params.items() if v is not None}
    try:
        for key in ("stop_token_ids", "logit_bias"):
            if bad := [int(t) for t in (sp.get(key) or ()) if not 0 <= int(t) < vocab_size]:
                raise ValueError(f"{key} names token {bad[0]}, outside the model's vocabulary of {vocab_size}")
        bias = tuple(sorted((int(t), min(max(float(b), -LOGIT_BIAS_LIMIT), LOGIT_BIAS_LIMIT))
                            for t, b in (sp.get("logit_bias") or {}).items()))
        ignore_eos = bool(sp.get("ignore_eos", defaults.ignore_eos))
        stops = tuple(sorted({*(() if ignore_eos else eos), *(int(t) for t in sp.get("stop_token_ids") or ())}))
        seed = sp.get("seed", defaults.seed)
        params = SamplingParams(
            temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
            top_k=int(sp.get("top_k", -1)), min_p=float(sp.get("min_p", 0.0)), max_new_tokens=max_new_tokens,
            min_tokens=int(sp.get("min_tokens", 0)), stop_token_ids=stops, logit_bias=bias,
            repetition_penalty=float(sp.get("repetition_penalty", defaults.repetition_penalty)),
            presence_penalty=float(sp.get("presence_penalty", 0.0)),
            frequency_penalty=float(sp.get("frequency_penalty", 0.0)))
        return params, int(seed) if seed is not None else None
    except (TypeError, ValueError) as e:
        raise refuse(str(e)) from None


class InfiniteServer:
    def __init__(self, config, model_config, replica_rank: int = 0, visible_devices: tuple[str, str] | None = None,
                 **_):
        """``visible_devices``: (variable, ids), e.g. ("CUDA_VISIBLE_DEVICES", "2,3"), the devices of the replica's
        workers (``InfiniteReplica``), set before anything touches the device, as verl's vLLM server does."""
        if visible_devices is not None:
            os.environ[visible_devices[0]] = visible_devices[1]
        import torch

        self.rollout = config
        self.settings = settings_from_rollout(config)
        if self.settings.threads:
            torch.set_num_threads(self.settings.threads)
        path = model_config["path"] if hasattr(model_config, "__getitem__") else model_config.path
        self.seed = int(config_value(config, "seed", 0) or 0)
        self.prompt_length = int(config_value(config, "prompt_length", 512))
        self.response_length = int(config_value(config, "response_length", 512))
        self.engine = build_engine(self.settings, config, path)
        self.max_model_len = int(config_value(config, "max_model_len", 0) or self.engine.max_positions)
        if self.max_model_len > self.engine.max_positions:  # (as verl's vLLM server)
            raise ValueError(f"actor_rollout_ref.rollout.max_model_len={self.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({self.engine.max_positions}); lower it or leave it unset")
        self.vocab_size = int(self.engine.model.config.vocab_size)
        self.stop_ids = _stop_token_ids(path)
        self.defaults = RolloutDefaults(
            ignore_eos=bool(config_value(config, "ignore_eos", False)),
            repetition_penalty=float(config_value(config, "repetition_penalty", 1.0)),
            seed=replica_rank + self.seed if config_value(config, "full_determinism", False) else None)
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self._pending: list[_Request] = []  # arrived, not yet in a rollout (the rollout thread takes joiners too)
        self._pending_lock = threading.Lock()
        self._issued: dict[tuple, int] = {}  # sample indices handed out per group this step
        self._worker: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.last_rollout_metrics: dict = {}
        self._step_metrics: dict = {}  # merged over the batches since the last pop_step_metrics()
        self._metrics_lock = threading.Lock()
        self._predictor = None  # history learns across steps
        self._paused = False  # abort_all_requests closes the gate, resume_generation opens it
        self._rejecting = False  # behind a closed gate: return "aborted" at once (True) or wait for the resume
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._abort = threading.Event()  # the decoding batch stops at its next step
        self._finished_lengths: deque[tuple[str, int]] = deque(maxlen=FINISHED_LENGTHS_KEPT)
        self._asleep: set[str] = set()  # what the engine's sleep mode has freed ("weights", "kv_cache")
        logger.info("InfiniteServer %d ready: %s on %s%s", replica_rank, path, self.settings,
                    f", {visible_devices[0]}={visible_devices[1]}" if visible_devices else "")

    # --- the request path ----------------------------------------------------------------------------------------
    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, priority=0, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None or audio_data is not None:
            raise NotImplementedError("the infinite rollout is text-only: no image/video/audio inputs")
        prompt_ids = [int(t) for t in prompt_ids]
        params, seed = request_sampling(sampling_params, request_id, max_new_tokens=self._response_cap(
            len(prompt_ids), sampling_params, request_id), eos=self.stop_ids, vocab_size=self.vocab_size,
            defaults=self.defaults)
        while self._paused:  # behind the gate abort_all_requests closed, as verl's vLLM server
            if self._rejecting:
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                                   extra_fields={"global_steps": self.global_steps})
            await self._resumed.wait()
        session = kwargs.get("session_id")
        req = _Request(request_id=request_id, prompt_ids=prompt_ids, params=params, seed=seed,
                       logprobs=bool(sampling_params.get("logprobs")),
                       session_id=int(session) if session is not None else None,
                       future=asyncio.get_running_loop().create_future(), arrived=time.monotonic())
        with self._pending_lock:
            self._pending.append(req)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        token_ids, log_probs, preempted, stop_reason = await req.future
        return TokenOutput(token_ids=token_ids, log_probs=log_probs if req.logprobs else None,
                           stop_reason=stop_reason, num_preempted=preempted,
                           extra_fields={"global_steps": self.global_steps})

    def _response_cap(self, prompt_tokens: int, sampling_params: dict, request_id: str) -> int:
        """The most tokens a request's response may have, as verl's vLLM server reckons it: its ``max_tokens`` (or
        ``max_new_tokens``), else what rollout.prompt_length + response_length leave after the prompt, at least 1 and
        within the model's context; past rollout.response_length a request is refused (verl's batch holds no more)."""
        room = self.max_model_len - prompt_tokens
        if room < 1:
            raise ValueError(f"request {request_id}: prompt of {prompt_tokens} tokens leaves no room for a response in "
                             f"the model's context of {self.max_model_len} tokens (actor_rollout_ref.rollout."
                             "max_model_len, else the model's max_position_embeddings); shorten the prompt")
        cap = min(self.response_length, self.prompt_length + self.response_length - prompt_tokens)
        for key in ("max_tokens", "max_new_tokens"):  # verl's vLLM server takes either, max_tokens first
            if sampling_params.get(key) is not None:
                cap = int(sampling_params[key])
                if cap > self.response_length:
                    raise ValueError(f"request {request_id}: {key}={cap} exceeds actor_rollout_ref.rollout."
                                     f"response_length={self.response_length}; lower it or raise response_length")
                break
        return max(1, min(cap, room))

    async def _drain(self) -> None:
        """Start a rollout once the arrivals pause (a group's n requests come together); one rollout at a time.
        Requests that arrive while it decodes join it (``_joining``); those with other sampling settings wait for
        the next."""
        window = self.settings.batch_window_ms / 1000
        loop = asyncio.get_running_loop()
        while self._pending:
            # wait until the arrivals pause, but no longer than BATCH_WINDOWS_AT_MOST windows: a steady stream of
            # requests must not hold back the ones already there
            deadline = loop.time() + BATCH_WINDOWS_AT_MOST * window
            while True:
                seen = len(self._pending)
                await asyncio.sleep(window)
                if len(self._pending) == seen or loop.time() >= deadline:
                    break
            async with self._lock:
                with self._pending_lock:
                    batch = self._take(self._pending[0].rollout_key) if self._pending else []
                if not batch:  # abort_all_requests took them
                    continue
                rollout = _LiveRollout(batch, loop)
                try:
                    if self._asleep:  # verl wakes a replica before it generates; a request that comes first wakes it
                        logger.warning("InfiniteServer %d: requests arrived while the engine sleeps (%s); waking it",
                                       self.replica_rank, sorted(self._asleep))
                        await self._wake_engine_locked()
                    await asyncio.to_thread(self._rollout, rollout)
                except BaseException as e:  # every request in flight fails loudly, none returns partial
                    for r in rollout.requests():
                        if not r.future.done():
                            r.future.set_exception(e)

    def _take(self, rollout_key: tuple) -> list[_Request]:
        """The pending requests a rollout with these sampling settings decodes (under ``_pending_lock``)."""
        taken = [r for r in self._pending if r.rollout_key == rollout_key]
        self._pending = [r for r in self._pending if r.rollout_key != rollout_key]
        return taken

    def _joining(self, rollout_key: tuple) -> list[_Request]:
        """In the rollout thread, after every decode step: the pending requests that join the running rollout, once
        their arrivals pause as ``_drain``'s do (within ``BATCH_WINDOWS_AT_MOST`` windows of the first)."""
        window = self.settings.batch_window_ms / 1000
        with self._pending_lock:
            alike = [r.arrived for r in self._pending if r.rollout_key == rollout_key]
            if not alike:
                return []
            now = time.monotonic()
            if now - max(alike) < window and now - min(alike) < BATCH_WINDOWS_AT_MOST * window:
                return []
            return self._take(rollout_key)

    def _rollout(self, rollout: "_LiveRollout") -> None:
        """One engine rollout (in a thread): the batch's groups, and the groups that join while it decodes; every
        request is answered as its sample finishes."""
        from ...predict import make_predictor
        from ...engines.base import Arrivals
        head = rollout.first[0]
        params = replace(head.params, max_new_tokens=self.response_length,
                         seed=self._step_seed() if head.seed is None else head.seed)
        first = self._groups_of(rollout.first)
        rollout.members.extend(first)
        capacity = self._capacity()
        if self._predictor is None:
            self._predictor = make_predictor(self.settings.predictor, max_len=self.response_length)

        def arrivals() -> Arrivals | None:
            joining = self._joining(rollout.key)
            if not joining:
                return None
            rollout.note_joined(joining)
            try:
                groups = self._groups_of(joining)
            except ValueError as e:  # (they fail alone; the rollout goes on)
                for r in joining:
                    rollout.answer(r, error=e)
                return None
            base = len(rollout.members)
            rollout.members.extend(groups)
            rollout.joined += len(joining)

            def refuse(error: Exception) -> None:
                del rollout.members[base:]
                for r in joining:
                    rollout.answer(r, error=ValueError(f"request {r.request_id}: {error}"))
            return Arrivals([list(g.prompt) for g in groups], [len(g.indices) for g in groups],
                            [g.prompt_key for g in groups], [g.indices for g in groups],
                            [g.max_tokens for g in groups], refuse)

        def on_finished(samples) -> None:
            for smp in samples:
                group, state = rollout.members[smp.group], DecodeState.of(smp)
                rollout.answer(group.requests[smp.index], (state.tokens, state.logprobs, smp.preemptions, "completed"))
                self._finished_lengths.append((group.prompt_key, len(state.tokens)))

        try:
            if self._abort.is_set():
                raise RolloutAborted(None)
            res = self.engine.rollout([list(g.prompt) for g in first], [len(g.indices) for g in first], params,
                                      policy=self.settings.policy, capacity=capacity, predictor=self._predictor,
                                      prompt_ids=[g.prompt_key for g in first],
                                      stream_indices=[g.indices for g in first],
                                      max_new_tokens=[g.max_tokens for g in first], fptas_eps=self.settings.fptas_eps,
                                      on_step=self._stop_if_aborted, on_finished=on_finished, arrivals=arrivals)
        except RolloutAborted as stop:
            for r, result in _aborted_results(rollout.members, stop.sched):
                rollout.answer(r, result)
            return
        self.last_rollout_metrics = {
            "infsample/decode_steps": res.stats.decode_steps, "infsample/peak_kv_bytes": res.kv.peak_in_use_bytes,
            "infsample/preemptions": res.stats.preemptions, "infsample/plan_ms": res.stats.plan_ms,
            "infsample/lookahead_prefills": res.stats.lookahead_prefills,
            "infsample/samples": sum(len(g.indices) for g in rollout.members), "infsample/wall_s": res.wall_s,
            "infsample/joined": rollout.joined, "infsample/lower_bound_steps": _lower_bound_steps(res, capacity)}
        with self._metrics_lock:  # what the trainer collects per step (pop_step_metrics): every batch counts
            self._step_metrics = merge_rollout_metrics(
                [self._step_metrics, {**self.last_rollout_metrics, "infsample/batches": 1,
                                      "infsample/total_tokens": res.total_tokens}], parallel=False)
        for group, outs in zip(rollout.members, res.outputs):  # (each was answered as it finished)
            for r, o in zip(group.requests, outs):
                rollout.answer(r, (o.token_ids, o.logprobs, o.preemptions, "completed"))

    def _groups_of(self, requests: list[_Request]) -> list["_RequestGroup"]:
        """Requests alike in prompt and sampling settings are one group's samples; groups by prompt, samples by index,
        whatever order the requests came in: the same batch gets the same plan (samples the predictor cannot tell
        apart are planned in position order), so decode steps repeat. A sample's index keys its random stream: its
        session id, else its arrival order within the step."""
        groups: dict[tuple, list[_Request]] = {}
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
            out.append(_RequestGroup(key[0], key_of_prompt, key[1], [reqs[i] for i in by_index],
                                     [indices[i] for i in by_index]))
        return out

    def _capacity(self):
        """``custom.kv_budget`` or ``custom.slots`` when set, else rollout.max_num_seqs slots."""
        from ...core.capacity import KVBudget, SlotPool

        if self.settings.kv_budget:
            return KVBudget(self.settings.kv_budget)
        if self.settings.slots:
            return SlotPool(self.settings.slots)
        return SlotPool(int(config_value(self.rollout, "max_num_seqs", 256)))

    def _step_seed(self) -> int:
        """The rollout seed mixed with the training step: a prompt seen again at a later step draws fresh samples,
        while within a step every sample's stream stays keyed by (seed, prompt, index), whatever the schedule."""
        if self.global_steps is None:
            return self.seed
        digest = hashlib.blake2b(f"{self.seed}@{self.global_steps}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def _stop_if_aborted(self, sched) -> None:
        """Called by the engine after every decode step (in the rollout thread)."""
        if self._abort.is_set():
            raise RolloutAborted(sched)

    # --- verl's lifecycle calls ----------------------------------------------------------------------------------
    # With the engine in sleep mode (on a GPU, with rollout.enable_sleep_mode) these free and restore GPU memory as
    # verl's vLLM server does, between batches (under the lock: never under a decoding batch). Sleep is level 1
    # (weights offloaded to host memory): they come back as they were, whether or not a weight sync follows. The
    # engine's paged KV store holds nothing between batches.
    def _sleeps(self) -> bool:
        return bool(getattr(self.engine, "enable_sleep_mode", False)) and bool(
            config_value(self.rollout, "free_cache_engine", True))

    async def _sleep_engine(self, tags: set[str]) -> None:
        """Free ``tags`` ("weights", "kv_cache") as well as what already sleeps. vLLM's sleep frees both at once, from
        an engine fully awake: so wake what sleeps, sleep, and re-wake what must stay."""
        async with self._lock:
            target = self._asleep | tags
            if target == self._asleep:
                return
            if self._asleep:
                await asyncio.to_thread(self.engine.wake_up, sorted(self._asleep))
            await asyncio.to_thread(self.engine.sleep, 1)
            if keep := sorted(SLEEP_TAGS - target):
                await asyncio.to_thread(self.engine.wake_up, keep)
            self._asleep = set(target)

    async def _wake_engine(self, tags=None) -> None:
        async with self._lock:
            await self._wake_engine_locked(tags)

    async def _wake_engine_locked(self, tags=None) -> None:
        wake = sorted(self._asleep if tags is None else self._asleep & set(tags))
        if wake:
            await asyncio.to_thread(self.engine.wake_up, wake)
            self._asleep -= set(wake)

    async def wake_up(self, tags=None):
        if self._sleeps():
            await self._wake_engine(tags)
        return True

    async def sleep(self):
        if self._sleeps():
            await self._sleep_engine(set(SLEEP_TAGS))
        return True

    async def clear_kv_cache(self):
        return True

    async def release_kv_cache(self):
        if self._sleeps():
            await self._sleep_engine({"kv_cache"})
        return True

    async def resume_kv_cache(self):
        if self._sleeps():
            await self._wake_engine(["kv_cache"])
        return True

    async def set_global_steps(self, global_steps):
        self.global_steps = global_steps
        self._issued.clear()  # a new step: sample indices start again at 0 (with a new random key)

    async def abort_all_requests(self, reject_request: bool = False):
        """As verl's vLLM server: close the gate (later requests wait for ``resume_generation``, or return "aborted"
        at once with ``reject_request``), return queued requests "aborted" with no tokens, and stop the decoding
        batch at its next step (finished samples "completed", the others their tokens so far, "aborted"). Returns
        once nothing decodes."""
        self._paused, self._rejecting = True, reject_request
        self._resumed.clear()
        with self._pending_lock:
            queued, self._pending = self._pending, []
        for r in queued:
            if not r.future.done():
                r.future.set_result(([], [], 0, "aborted"))
        self._abort.set()
        async with self._lock:  # taken once the decoding batch (if any) has stopped and answered its requests
            self._abort.clear()
        return {"aborted_count": len(queued), "request_ids": [r.request_id for r in queued]}

    async def resume_generation(self):
        self._paused = self._rejecting = False
        self._resumed.set()
        return True

    async def pop_finished_lengths(self) -> list[tuple[str, int]]:
        """(``prompt_key``, response length) of every sample finished since the last call: how the group-affinity
        router (``router.GroupAffinityRouter``) learns lengths. The newest ``FINISHED_LENGTHS_KEPT`` are kept."""
        lengths = list(self._finished_lengths)
        self._finished_lengths.clear()
        return lengths

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None

    async def update_weights(self, named_tensors: dict) -> int:
        """Load (a bucket of) new weights by HF parameter name into the engine (its ``load_weights``), between
        batches; returns how many tensors were loaded."""
        async with self._lock:  # never under a decoding batch (vLLM refuses weights with requests in flight)
            return await asyncio.to_thread(self.engine.load_weights, list(named_tensors.items()))

    def get_metrics(self) -> dict:
        return dict(self.last_rollout_metrics)

    async def pop_step_metrics(self) -> dict:
        """The ``infsample/*`` metrics merged over every batch decoded since the last call (empty if none), then
        reset: verl's trainer calls it once per step (``integration.balance.InfiniteSyncTrainer.step``)."""
        with self._metrics_lock:
            metrics, self._step_metrics = self._step_metrics, {}
        return metrics


# How the infsample/* metrics of several rollouts combine. Batches of one server run one after another (times and
# steps add up); replicas run side by side (the slowest one is the step's rollout time). Counts always add up.
_SUM = ("infsample/samples", "infsample/preemptions", "infsample/batches", "infsample/joined", "infsample/total_tokens",
        "infsample/lookahead_prefills", "infsample/tokens_computed", "infsample/cached_prompt_tokens",
        "infsample/probes", "infsample/probe_continuations", "infsample/probe_skipped")
_SEQUENTIAL = ("infsample/decode_steps", "infsample/lower_bound_steps", "infsample/plan_ms", "infsample/wall_s")  # sum in a server, max across
_MAX = ("infsample/peak_kv_bytes", "infsample/peak_kv_blocks", "infsample/kv_blocks", "infsample/kv_block_size")


def merge_rollout_metrics(metrics: list[dict], *, parallel: bool) -> dict:
    """Combine ``infsample/*`` metric dicts: of one server's successive batches (``parallel=False``) or of several
    replicas' step totals (``parallel=True``). Keys outside the known ones are dropped; empty dicts are ignored."""
    metrics = [m for m in metrics if m]
    out: dict = {}
    for key in _SUM + _SEQUENTIAL + _MAX:
        values = [m[key] for m in metrics if key in m]
        if not values:
            continue
        out[key] = max(values) if key in _MAX or (parallel and key in _SEQUENTIAL) else sum(values)
    if parallel and metrics:
        out["infsample/replicas"] = len(metrics)
    return out


def _lower_bound_steps(res, capacity) -> int:
    """No schedule decodes this batch in fewer steps: max(longest sample, ceil(tokens / M)); under a KV budget,
    the longest sample (the budget's own bound needs the prompts: see ``engines.simulated``)."""
    lengths = [len(o.token_ids) for group in res.outputs for o in group]
    longest = max(lengths, default=0)
    if capacity.slots is not None:
        return max(longest, -(-sum(lengths) // capacity.slots))
    return longest


class RolloutAborted(Exception):
    """Raised in the rollout thread once ``abort_all_requests`` asks; carries the scheduler (None: never started)."""

    def __init__(self, sched):
        super().__init__("rollout aborted by abort_all_requests")
        self.sched = sched


def _aborted_results(members: list[_RequestGroup], sched) -> list[tuple[_Request, tuple]]:
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


def build_engine(settings, rollout, model_path: str):
    """The server's decode engine: the transformers engine on the replica's device (the server sees its workers'
    GPUs), in ``settings.choose_dtype``'s dtype. (``custom.engine=vllm`` never reaches this server: it is verl's own
    vLLM server with our scheduling, ``vllm_server.InfiniteVLLMServer``.)"""
    import torch

    from ...engines.transformers_engine import TransformersEngine

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = choose_dtype(settings.dtype, device=device, rollout_dtype=config_value(rollout, "dtype"))
    logger.info("build_engine: transformers engine on %s in %s", device, dtype)
    # sleep mode where it frees something: the weights leave the GPU while verl trains (as verl's vLLM server)
    sleeps = device != "cpu" and bool(config_value(rollout, "enable_sleep_mode", True))
    return TransformersEngine.from_pretrained(model_path, dtype=getattr(torch, dtype), device=device,
                                              block_size=settings.block_size, enable_sleep_mode=sleeps)


def _stop_token_ids(path: str) -> tuple[int, ...]:
    """eos ids from the generation config and the tokenizer (a response ends at any of them, included)."""
    from transformers import AutoTokenizer, GenerationConfig

    ids: set[int] = set()
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:
        pass
    tok = AutoTokenizer.from_pretrained(path)
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    if not ids:
        raise ValueError(f"{path}: no eos token in the generation config or tokenizer; responses could never stop")
    return tuple(sorted(ids))
