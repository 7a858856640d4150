"""``rollout.name=infinite`` on vLLM: verl's own vLLM server, with the plan's order in front of vLLM's scheduler.

:class:`InfiniteVLLMServer` is verl's ``vLLMHttpServer``, so everything verl's vLLM rollout does comes with it
unchanged: the engine it builds from the rollout config (tensor, data and expert parallelism, quantization, LoRA),
its weight transfer from the training workers (verl's own ``ServerAdapter`` on the worker side, see
``factory.make_rollout_adapter``), sleep and wake-up, abort and resume, every sampling parameter verl sends, and
multi-turn prompts that reuse their KV through vLLM's prefix cache. What it adds is the scheduling:

- vLLM runs with ``scheduling_policy=priority`` and prefix caching, and each request gets the priority of its
  sample's place in the plan (``order``, ``priority``: longest predicted first by a sample's own
  prediction; a group's samples together where only its prompt's history predicts them), so vLLM's continuous
  batching refills freed slots in the plan's order and a group's samples share its prompt's cached blocks;
- with a predictor that reads tokens (``custom.predictor=learned``) each sample is probed (``probe``): its first k
  tokens decode ahead of every planned request, their opening predicts the sample's own length, and the rest of it
  waits in the server (``gate.EngineGate``, the one owner of what is inside vLLM) until vLLM has room (its batch
  and as many waiting), then goes in ranked by the predictions as they stand at that moment (siblings finished
  since, the step's first samples learned); verl gets one response. A request whose parameters a split would change
  runs whole (counted in ``infsample/probe_skipped``). Whether a probe's sample goes on is vLLM's own finish reason
  for it ("length", not "stop"), which its stat logger reports (``stats.on_finished``). An abort
  (``abort_all_requests``: verl's weight sync, ``colocate_async``) answers each held sample with its probe's tokens, stopped "aborted", which verl resumes from those tokens;
- where samples run longest first by their own predictions, vLLM keeps ``REST_WATERMARK`` of its KV blocks free
  when it admits (its ``watermark``; ``VLLMRequestOrder.engine_watermark``): the long samples' KV grows together,
  and without headroom vLLM admits into the last blocks, then preempts and recomputes. A user's
  ``rollout.engine_kwargs.vllm.watermark`` wins;
- ``custom.slots`` is vLLM's ``max_num_seqs`` (samples decoded at once);
- ``custom.speculative`` sets vLLM's ``speculative_config``; with ``group`` vLLM's workers build the drafter
  (``verl_infsample.drafter``: vLLM calls its ``propose`` each step, and its rejection sampler's verdicts reach it),
  each request tells it its group, predicted length and where its response starts (``extra_args``, written by
  ``drafter.hints``), and its figures and law check come back through the worker extension (``drafts``,
  ``worker_extension``); what vLLM refuses with drafts on is refused here first, by name;
- the step's figures (engine steps, preemptions, tokens computed, peak KV blocks, the engine's own wall time) come
  from vLLM's per-step stats (``stats``) for the ``infinite_sync`` trainer to log, and the lengths of finished
  samples for the group-affinity router (``pop_finished_lengths``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque

import ray
from verl.workers.rollout.vllm_rollout import vllm_async_server as _verl_vllm
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from ....drafter.hints import HINT_KEYS, DraftHints, SampleArrival, length_hint
from ....predict import make_predictor
from ....predict.features import TokenWindow
from ...settings import check_speculative, config_value, settings_from_rollout, vllm_ordering
from ..requests import FINISHED_LENGTHS_KEPT, REQUESTS_IN_FLIGHT
from . import drafts, probe
from . import stats as vllm_stats
from .gate import EngineGate
from .order import OrderedRequest, VLLMRequestOrder, engine_room

logger = logging.getLogger(__name__)
FINISH_REASON_TIMEOUT_S = 30.0  # vLLM records a step's finished requests right after handing out their outputs


def _vllm_has_watermark() -> bool:
    """Whether this vLLM's engine takes ``watermark`` (KV blocks kept free at admission)."""
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    return "watermark" in {f.name for f in fields(EngineArgs)}


class InfiniteVLLMServer(vLLMHttpServer):
    def __init__(self, *args, **kwargs):
        # this actor's process builds our server's AsyncLLM (verl's module builds it): it carries the step's figures
        vllm_stats.instrument(_verl_vllm)
        super().__init__(*args, **kwargs)
        self._init_scheduling()

    def _init_scheduling(self) -> None:
        """What this server keeps beside verl's (from ``self.config``): the plan's order, the rests it holds, the
        step's figures."""
        self.settings = settings_from_rollout(self.config)
        check_speculative(self.settings, "vllm", config_value(config_value(self.config, "engine_kwargs", {}), "vllm"),
                          config_value(self.config, "mtp"))
        drafts.say_what_drafts_cost(self.settings.speculative)
        self.drafts = drafts.DraftReport(self.settings.speculative, self.settings.law_guard)
        self.draft_hints = DraftHints()
        max_num_seqs = self.settings.slots or int(self.config.max_num_seqs)
        self.order = VLLMRequestOrder(vllm_ordering(self.settings),
                                      make_predictor(self.settings.predictor, max_len=int(self.config.response_length)),
                                      room=engine_room(max_num_seqs * int(self.config.data_parallel_size or 1)))
        self.gate = EngineGate(self.order)
        self._finished_lengths: deque[tuple[str, int]] = deque(maxlen=FINISHED_LENGTHS_KEPT)
        self._group_size = int(self.config.n or 1)  # GRPO's rollout.n: the samples a prompt's group expects
        self._counts: Counter[str] = Counter()  # probes this step, for infsample/*
        self._refusals_logged: set[str] = set()
        self._probe_reasons: dict[str, asyncio.Future] = {}  # a probe in flight -> vLLM's finish reason for it
        self._engine_slots = max_num_seqs  # one engine's (one data-parallel rank's) max_num_seqs
        vllm_stats.on_step(self._engine_step)
        vllm_stats.on_finished(self._request_finished)

    def _get_worker_extension_cls(self) -> str:
        """verl's colocate extension, with what the drafter reports (``worker_extension``)."""
        from .worker_extension import CLASS_PATH

        return CLASS_PATH

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        engine_kwargs["scheduling_policy"] = "priority"
        engine_kwargs["enable_prefix_caching"] = True
        if self.settings.slots is not None:
            engine_kwargs["max_num_seqs"] = self.settings.slots
        if (speculative := self.settings.speculative_config()) is not None:
            engine_kwargs["speculative_config"] = speculative
        watermark = self.order.engine_watermark()
        if watermark and "watermark" not in engine_kwargs:  # rollout.engine_kwargs.vllm.watermark, if set, wins
            if _vllm_has_watermark():
                engine_kwargs["watermark"] = watermark
            else:
                logger.warning("rollout.name=infinite: this vLLM has no `watermark`; held rests run without KV "
                               "headroom at admission (expect more preemptions in a tight KV pool)")

    async def generate(self, prompt_ids, sampling_params, request_id, *args, priority: int = 0, **kwargs):
        """verl's ``generate`` at the plan's priority, probed where the plan reads tokens. The plan sets every
        request's vLLM priority, so a caller's own ``priority`` is refused (verl sends none to this rollout)."""
        if priority:
            raise ValueError(f"generate(priority={priority!r}): rollout.name=infinite orders every request by its "
                             "plan (actor_rollout_ref.rollout.custom.policy) and takes no caller priority; send "
                             "priority=0, or run rollout.name=vllm to order requests by the caller's priority")
        total = self._max_tokens(prompt_ids, sampling_params)
        drafts.refuse_what_drafts_change(self.settings.speculative, sampling_params)
        refusal = None
        if self.order.probe_tokens and total > self.order.probe_tokens:
            refusal = probe.probe_refusal(
                sampling_params, seeded=bool(self.config.full_determinism),
                multimodal=bool(args) or any(kwargs.get(k) for k in ("image_data", "video_data", "audio_data",
                                                                     "mm_processor_kwargs")),
                routed_experts=bool(self.config.enable_rollout_routing_replay),
                kv_transfer=kwargs.get("kv_transfer_params") is not None or bool(self._pd_decode_peers))
            if refusal is not None:
                self._counts["probe_skipped"] += 1
                if refusal not in self._refusals_logged:
                    self._refusals_logged.add(refusal)
                    logger.warning("rollout.name=infinite: requests with %r run whole, not probed: a split would "
                                   "change what it means (counted in infsample/probe_skipped)", refusal)
        with self.gate.planning():
            request = self.order.arrive(prompt_ids, group_size=self._group_size, max_tokens=total,
                                        may_probe=refusal is None)
        arrival = None
        if self.settings.speculative == "group":  # what the drafter cannot see in the batch (``drafter.hints``)
            arrival = self.draft_hints.arrive(request_id, len(prompt_ids), request.group.prompt_id)
            sampling_params = _with_hints(sampling_params, arrival.extra_args(
                length_hint(request.sample.predicted_len, total), "head" if request.probe else "whole"))
        output = None
        try:
            if request.probe:
                output = await self._generate_probed(request, prompt_ids, sampling_params, request_id, total, kwargs,
                                                     arrival)
            else:
                output = await self._engine_generate(prompt_ids, sampling_params, request_id, *args,
                                                     priority=request.priority, **kwargs)
            if output.stop_reason == "completed":
                length = len(output.token_ids)
                with self.gate.planning():
                    self._finished_lengths.append((self.order.finished(request, length), length))
            return output
        finally:
            self.gate.release()  # what it freed (and taught) goes to the held rests
            if arrival is not None:
                self.draft_hints.ended(request_id, arrival, output.stop_reason if output is not None else None)

    async def _engine_generate(self, *args, released: bool = False, **kwargs):
        """verl's ``generate``: one request into vLLM, through the gate (``released``: a held rest, let in)."""
        with self.gate.inside(released):
            return await super().generate(*args, **kwargs)

    async def _generate_probed(self, request: OrderedRequest, prompt_ids, sampling_params, request_id, total: int,
                               kwargs: dict, arrival: SampleArrival | None):
        """The probe, then (unless it ended the sample) the rest at its own prediction's priority, joined. The
        drafter (``arrival``) is told the probe is a head, and the rest its prediction after the probe."""
        k = self.order.probe_tokens
        probe_params, rest_params = probe.split_params(sampling_params, total, k)
        probe_id = f"{request_id}{probe.PROBE_SUFFIX}"
        reason = self._probe_reasons[probe_id] = asyncio.get_running_loop().create_future()
        try:
            head = await self._engine_generate(prompt_ids, probe_params, probe_id, priority=request.priority, **kwargs)
            if head.stop_reason == "completed" and len(head.token_ids) >= k and not reason.done():
                try:  # "stop" or "length": vLLM says which
                    await asyncio.wait_for(reason, FINISH_REASON_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raise RuntimeError(f"vLLM reported no finish reason for {probe_id!r} within "
                                       f"{FINISH_REASON_TIMEOUT_S} s: the server's stat logger is missing "
                                       "(rollout.name=infinite needs vLLM's stats, do not set disable_log_stats)"
                                       ) from None
        finally:
            self._probe_reasons.pop(probe_id, None)
        self._counts["probes"] += 1
        if head.stop_reason != "completed" or len(head.token_ids) < k or reason.result() != "length":
            return head  # the sample ended within its probe (or was aborted: verl resumes it from its tokens)
        self._counts["probe_continuations"] += 1
        with self.gate.planning():
            self.order.after_probe(request, TokenWindow(list(head.token_ids), head.log_probs))
        released, waited = await self.gate.turn(request)
        self._counts["rests_held"] += waited  # vLLM was full: it waited here, to be ranked when it had room
        if not released:  # aborted while held: verl resumes it from the probe's tokens
            self._counts["held_aborted"] += 1
            return head.model_copy(update={"stop_reason": "aborted"})
        if arrival is not None:  # the prediction as it stands when the rest goes in (held rests are re-ranked)
            rest_params = _with_hints(rest_params, arrival.extra_args(
                length_hint(request.sample.predicted_len, total), "rest"))
        rest = await self._engine_generate(list(prompt_ids) + list(head.token_ids), rest_params, request_id,
                                           priority=request.priority, released=True, **kwargs)
        return probe.join(head, rest)

    def _engine_step(self, scheduler_stats) -> None:
        """An engine step's stats (vLLM's front end records them on this event loop): slots stood free with nothing
        waiting in vLLM while rests were held here, so the server's round trip outlasts what waits inside vLLM.
        From now on that many more requests may be inside it (``VLLMRequestOrder.widen``), and the held rests that
        now fit go in (``infsample/starved_steps`` counts such steps, ``infsample/engine_room`` says the room)."""
        free = self._engine_slots - scheduler_stats.num_running_reqs
        if free > 0 and scheduler_stats.num_waiting_reqs == 0 and self.order.held:
            self._counts["starved_steps"] += 1
            self.gate.widen(free)

    def _request_finished(self, request_id: str, finish_reason: str) -> None:
        """vLLM finished a request (its stat logger reports each, on this event loop): a probe's reason says whether
        its sample goes on ("length": cut at the probe's k tokens) or ended there (verl's ``generate`` answers
        "completed" for both)."""
        reason = self._probe_reasons.get(request_id)
        if reason is not None and not reason.done():
            reason.set_result(finish_reason)

    async def abort_all_requests(self, *args, **kwargs):
        """verl's abort, and every held rest answered "aborted" with its probe's tokens (verl resumes it)."""
        self.gate.abort()
        return await super().abort_all_requests(*args, **kwargs)

    def _max_tokens(self, prompt_ids, sampling_params) -> int:
        """The response budget verl's ``generate`` gives this request (its ``max_tokens``, else the rollout's)."""
        room = int(self.config.max_model_len) - len(prompt_ids)
        total = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if total is None:
            total = min(int(self.config.response_length),
                        int(self.config.prompt_length) + int(self.config.response_length) - len(prompt_ids))
        return max(1, min(int(total), room))

    async def set_global_steps(self, global_steps: int):
        """verl's weight sync, before each step's rollout: a new step, its groups counted afresh."""
        await super().set_global_steps(global_steps)
        self.order.new_step()
        await self.drafts.collect(self._worker_rpc)  # the law guard, in every trainer mode

    async def pop_finished_lengths(self) -> list[tuple[str, int]]:
        """(``prompt_key``, length) of each sample finished since the last call, for the group-affinity router."""
        lengths = list(self._finished_lengths)
        self._finished_lengths.clear()
        return lengths

    async def pop_step_metrics(self) -> dict:
        """The ``infsample/*`` figures of the engine steps since the last call (``stats``), the probes
        among them (a probed sample is two vLLM requests: ``samples`` counts it once)."""
        metrics = vllm_stats.pop_step_metrics()
        counts, self._counts = self._counts, Counter()
        if metrics and "infsample/samples" in metrics:
            metrics["infsample/samples"] -= counts["probe_continuations"]
        counts["plan_ms"] = self.gate.pop_plan_ms()
        metrics.update({f"infsample/{k}": v for k, v in counts.items()})
        metrics["infsample/engine_room"] = self.order.room
        metrics.update(await self.drafts.pop_metrics(self._worker_rpc))
        return metrics

    async def _worker_rpc(self, method: str) -> list:
        return await self.engine.collective_rpc(method)


def _with_hints(sampling_params: dict, hints: dict) -> dict:
    """``sampling_params`` with the drafter's hints among its ``extra_args`` (vLLM hands them to the drafter), in
    place of any it had (a probe's, where its rest is told)."""
    kept = {k: v for k, v in (sampling_params.get("extra_args") or {}).items() if k not in HINT_KEYS}
    return {**sampling_params, "extra_args": {**kept, **hints}}


class InfiniteVLLMReplica(vLLMReplica):
    """verl's vLLM replica (placement, TP/DP layout, sleep, abort) serving :class:`InfiniteVLLMServer`, named
    ``infinite_server_<rank>_<node>`` as verl's worker-side ``ServerAdapter`` looks it up for ``rollout.name``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(InfiniteVLLMServer)

    def _get_server_name_prefix(self) -> str:
        return "infinite_"

    @property
    def max_concurrency(self) -> int:
        """Every request of the step inside vLLM, where its priority orders it (not queued in Ray, unseen)."""
        return max(super().max_concurrency, REQUESTS_IN_FLIGHT)
