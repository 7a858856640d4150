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

Threads: ``generate``, the ``_drain`` task and every lifecycle call run on the actor's asyncio event loop; one engine
rollout at a time runs on a worker thread (``asyncio.to_thread(self._rollout, ...)``: the rollout thread), and with
it the engine's callbacks (``_stop_if_aborted`` and ``arrivals`` after every step, ``on_finished``); the engine's
``sleep``, ``wake_up`` and ``load_weights`` run on worker threads too. ``_engine_lock`` (asyncio.Lock) gives the engine
to one user at a time: ``_drain`` holds it from taking a batch until the rollout thread returns, sleep and wake (and
the ``_asleep`` set) and ``update_weights`` take it, and ``abort_all_requests`` takes it to wait until the decoding
batch has stopped and answered. ``RequestBatcher._pending_lock`` (threading.Lock) guards the waiting requests, added
by ``generate`` and taken by ``_drain`` and ``abort_all_requests`` on the loop and by ``joining`` on the rollout
thread. ``_metrics_lock`` (threading.Lock) guards ``_step_metrics``, merged on the rollout thread after each batch
and swapped out by ``pop_step_metrics``. ``_abort`` (threading.Event), set by ``abort_all_requests``, is read by the
rollout thread before the engine starts and after every step, and stops the rollout there (``RolloutAborted``); it is
cleared once ``_engine_lock`` is free again. ``_resumed`` (asyncio.Event) is the gate: ``abort_all_requests`` clears it,
``resume_generation`` sets it, and ``generate`` waits on it while paused. Each request's ``future`` (asyncio.Future)
is made and awaited on the loop and set only there: the rollout thread hands results over with
``call_soon_threadsafe`` (``LiveRollout.answer``, once per request), ``abort_all_requests`` and a failed batch set it
directly, and whichever comes first wins. The rest is shared without a lock, on the GIL alone:
``last_rollout_metrics`` (replaced whole by the rollout thread), ``_finished_lengths`` (a deque the rollout thread
appends to and ``pop_finished_lengths`` copies, then clears), ``global_steps``, and ``RequestBatcher``'s sample
indices, handed out on the rollout thread and reset by ``set_global_steps``, which verl sends with a weight sync.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import replace

from ....engines.sample_state import DecodeState
from ...settings import check_speculative, choose_dtype, config_value, settings_from_rollout
from .batching import Request, RequestBatcher
from .live_rollout import LiveRollout, RolloutAborted, aborted_results
from ..metrics import merge_rollout_metrics, rollout_metrics
from ..requests import FINISHED_LENGTHS_KEPT, RolloutDefaults, request_sampling, response_cap

logger = logging.getLogger(__name__)
SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # what the engine's sleep mode frees (vLLM's wake_up tags)


class InfiniteServer:
    def __init__(self, config, model_config, replica_rank: int = 0, visible_devices: tuple[str, str] | None = None,
                 **_):
        """``visible_devices``: (variable, ids), e.g. ("CUDA_VISIBLE_DEVICES", "2,3"), the devices of the replica's
        workers (``TransformersReplica``), set before anything touches the device, as verl's vLLM server does."""
        if visible_devices is not None:
            os.environ[visible_devices[0]] = visible_devices[1]
        import torch

        self.rollout = config
        self.settings = settings_from_rollout(config)
        check_speculative(self.settings, "transformers")
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
        self._batcher = RequestBatcher(self.settings.batch_window_ms / 1000)
        self._worker: asyncio.Task | None = None  # the one ``_drain`` task
        self._engine_lock = asyncio.Lock()
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
        cap = response_cap(len(prompt_ids), sampling_params, request_id, max_model_len=self.max_model_len,
                           prompt_length=self.prompt_length, response_length=self.response_length)
        params, seed = request_sampling(sampling_params, request_id, max_new_tokens=cap, eos=self.stop_ids,
                                        vocab_size=self.vocab_size, defaults=self.defaults)
        while self._paused:  # behind the gate abort_all_requests closed, as verl's vLLM server
            if self._rejecting:
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                                   extra_fields={"global_steps": self.global_steps})
            await self._resumed.wait()
        session = kwargs.get("session_id")
        req = Request(request_id=request_id, prompt_ids=prompt_ids, params=params, seed=seed,
                      logprobs=bool(sampling_params.get("logprobs")),
                      session_id=int(session) if session is not None else None,
                      future=asyncio.get_running_loop().create_future(), arrived=time.monotonic())
        self._batcher.add(req)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        token_ids, log_probs, preempted, stop_reason = await req.future
        return TokenOutput(token_ids=token_ids, log_probs=log_probs if req.logprobs else None,
                           stop_reason=stop_reason, num_preempted=preempted,
                           extra_fields={"global_steps": self.global_steps})

    async def _drain(self) -> None:
        """Start a rollout once the arrivals pause (a group's n requests come together); one rollout at a time.
        Requests that arrive while it decodes join it (``RequestBatcher.joining``); those with other sampling settings
        wait for the next."""
        loop = asyncio.get_running_loop()
        while self._batcher.waiting:
            await self._batcher.arrivals_pause()
            async with self._engine_lock:
                batch = self._batcher.take_batch()
                if not batch:  # abort_all_requests took them
                    continue
                rollout = LiveRollout(batch, loop)
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

    def _rollout(self, rollout: LiveRollout) -> None:
        """One engine rollout (on the rollout thread): the batch's groups, and the groups that join while it decodes;
        every request is answered as its sample finishes."""
        from ....predict import make_predictor

        head = rollout.first[0]
        params = replace(head.params, max_new_tokens=self.response_length,
                         seed=self._step_seed() if head.seed is None else head.seed)
        first = self._batcher.groups_of(rollout.first)
        rollout.members.extend(first)
        capacity = self._capacity()
        if self._predictor is None:
            self._predictor = make_predictor(self.settings.predictor, max_len=self.response_length)

        def arrivals():
            joining = self._batcher.joining(rollout.key)
            return rollout.join(joining, self._batcher.groups_of) if joining else None

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
            for r, result in aborted_results(rollout.members, stop.sched):
                rollout.answer(r, result)
            return
        samples = sum(len(g.indices) for g in rollout.members)
        self.last_rollout_metrics = rollout_metrics(res, capacity, samples=samples, joined=rollout.joined)
        with self._metrics_lock:  # what the trainer collects per step (pop_step_metrics): every batch counts
            self._step_metrics = merge_rollout_metrics(
                [self._step_metrics, {**self.last_rollout_metrics, "infsample/batches": 1,
                                      "infsample/total_tokens": res.total_tokens}], parallel=False)
        for group, outs in zip(rollout.members, res.outputs):  # (each was answered as it finished)
            for r, o in zip(group.requests, outs):
                rollout.answer(r, (o.token_ids, o.logprobs, o.preemptions, "completed"))

    def _capacity(self):
        """``custom.kv_budget`` or ``custom.slots`` when set, else rollout.max_num_seqs slots."""
        from ....core.capacity import KVBudget, SlotPool

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
    # verl's vLLM server does, between batches (under ``_engine_lock``: never under a decoding batch). Sleep is level 1
    # (weights offloaded to host memory): they come back as they were, whether or not a weight sync follows. The
    # engine's paged KV store holds nothing between batches.
    def _sleeps(self) -> bool:
        return bool(getattr(self.engine, "enable_sleep_mode", False)) and bool(
            config_value(self.rollout, "free_cache_engine", True))

    async def _sleep_engine(self, tags: set[str]) -> None:
        """Free ``tags`` ("weights", "kv_cache") as well as what already sleeps. vLLM's sleep frees both at once, from
        an engine fully awake: so wake what sleeps, sleep, and re-wake what must stay."""
        async with self._engine_lock:
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
        async with self._engine_lock:
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
        self._batcher.new_step()

    async def abort_all_requests(self, reject_request: bool = False):
        """As verl's vLLM server: close the gate (later requests wait for ``resume_generation``, or return "aborted"
        at once with ``reject_request``), return queued requests "aborted" with no tokens, and stop the decoding
        batch at its next step (finished samples "completed", the others their tokens so far, "aborted"). Returns
        once nothing decodes."""
        self._paused, self._rejecting = True, reject_request
        self._resumed.clear()
        queued = self._batcher.take_all()
        for r in queued:
            if not r.future.done():
                r.future.set_result(([], [], 0, "aborted"))
        self._abort.set()
        async with self._engine_lock:  # taken once the decoding batch (if any) has stopped and answered its requests
            self._abort.clear()
        return {"aborted_count": len(queued), "request_ids": [r.request_id for r in queued]}

    async def resume_generation(self):
        self._paused = self._rejecting = False
        self._resumed.set()
        return True

    async def pop_finished_lengths(self) -> list[tuple[str, int]]:
        """(``prompt_key``, response length) of every sample finished since the last call: how the group-affinity
        router (``router.GroupAffinityRouter``) learns lengths. The newest ``FINISHED_LENGTHS_KEPT`` are kept. Taken
        one at a time: the rollout thread may append while this runs, and none of its lengths is lost."""
        lengths = []
        while self._finished_lengths:
            lengths.append(self._finished_lengths.popleft())
        return lengths

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None

    async def update_weights(self, named_tensors: dict) -> int:
        """Load (a bucket of) new weights by HF parameter name into the engine (its ``load_weights``), between
        batches; returns how many tensors were loaded."""
        async with self._engine_lock:  # never under a decoding batch (vLLM refuses weights with requests in flight)
            return await asyncio.to_thread(self.engine.load_weights, list(named_tensors.items()))

    def get_metrics(self) -> dict:
        return dict(self.last_rollout_metrics)

    async def pop_step_metrics(self) -> dict:
        """The ``infsample/*`` metrics merged over every batch decoded since the last call (empty if none), then
        reset: verl's trainer calls it once per step (``integration.balance.InfiniteSyncTrainer.step``)."""
        with self._metrics_lock:
            metrics, self._step_metrics = self._step_metrics, {}
        return metrics


def build_engine(settings, rollout, model_path: str):
    """The server's decode engine: the transformers engine on the replica's device (the server sees its workers'
    GPUs), in ``settings.choose_dtype``'s dtype. (``custom.engine=vllm`` never reaches this server: it is verl's own
    vLLM server with our scheduling, ``vllm.server.InfiniteVLLMServer``.)"""
    import torch

    from ....engines.transformers_engine import TransformersEngine

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
