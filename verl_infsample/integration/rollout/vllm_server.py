"""``rollout.name=infinite`` on vLLM: verl's own vLLM server, with the plan's order in front of vLLM's scheduler.

:class:`InfiniteVLLMServer` is verl's ``vLLMHttpServer``, so everything verl's vLLM rollout does comes with it
unchanged: the engine it builds from the rollout config (tensor, data and expert parallelism, quantization, LoRA),
its weight transfer from the training workers (verl's own ``ServerAdapter`` on the worker side, see
``adapter.InfiniteRolloutAdapter``), sleep and wake-up, abort and resume, every sampling parameter verl sends, and
multi-turn prompts that reuse their KV through vLLM's prefix cache. What it adds is the scheduling:

- vLLM runs with ``scheduling_policy=priority`` and prefix caching, and each request gets the priority of its
  sample's place in the plan (``vllm_order``, ``core.priority``: longest predicted first by a sample's own
  prediction; a group's samples together where only its prompt's history predicts them), so vLLM's continuous
  batching refills freed slots in the plan's order and a group's samples share its prompt's cached blocks;
- with a predictor that reads tokens (``custom.predictor=learned``) each sample is probed (``probe``): its first k
  tokens decode ahead of every planned request, their opening predicts the sample's own length, and the rest of it
  runs at that prediction's place; verl gets one response. A request whose parameters a split would change runs
  whole (counted in ``infsample/probe_skipped``);
- ``custom.slots`` is vLLM's ``max_num_seqs`` (samples decoded at once);
- the step's figures (engine steps, preemptions, tokens computed, peak KV blocks, the engine's own wall time) come
  from vLLM's per-step stats (``vllm_stats``) for the ``infinite_sync`` trainer to log, and the lengths of finished
  samples for the group-affinity router (``pop_finished_lengths``).
"""

from __future__ import annotations

import logging
from collections import Counter, deque

import ray
from verl.workers.rollout.vllm_rollout import vllm_async_server as _verl_vllm
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from ...predict import make_predictor
from ...predict.features import TokenWindow
from ..settings import settings_from_rollout, vllm_ordering
from . import probe, vllm_stats
from .server import FINISHED_LENGTHS_KEPT, REQUESTS_IN_FLIGHT
from .vllm_order import OrderedRequest, VLLMRequestOrder

logger = logging.getLogger(__name__)
vllm_stats.instrument(_verl_vllm)  # this process builds our server's AsyncLLM: it carries the step's figures


class InfiniteVLLMServer(vLLMHttpServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = settings_from_rollout(self.config)
        self.order = VLLMRequestOrder(vllm_ordering(self.settings),
                                      make_predictor(self.settings.predictor, max_len=int(self.config.response_length)))
        self._finished_lengths: deque[tuple[str, int]] = deque(maxlen=FINISHED_LENGTHS_KEPT)
        self._group_size = int(self.config.n or 1)  # GRPO's rollout.n: the samples a prompt's group expects
        self._counts: Counter[str] = Counter()  # probes this step, for infsample/*
        self._probe_ids: set[str] = set()
        self._refusals_logged: set[str] = set()
        self._finish_reasons: dict[str, str] = {}

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        engine_kwargs["scheduling_policy"] = "priority"
        engine_kwargs["enable_prefix_caching"] = True
        if self.settings.slots is not None:
            engine_kwargs["max_num_seqs"] = self.settings.slots

    async def generate(self, prompt_ids, sampling_params, request_id, *args, priority: int = 0, **kwargs):
        """verl's ``generate`` at the plan's priority (the caller's ``priority`` orders what the plan ranks equal),
        probed where the plan reads tokens."""
        total = self._max_tokens(prompt_ids, sampling_params)
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
        request = self.order.arrive(prompt_ids, caller=priority, group_size=self._group_size, max_tokens=total,
                                    may_probe=refusal is None)
        if request.probe:
            output = await self._generate_probed(request, prompt_ids, sampling_params, request_id, total, kwargs)
        else:
            output = await super().generate(prompt_ids, sampling_params, request_id, *args, priority=request.priority,
                                            **kwargs)
        if output.stop_reason == "completed":
            length = len(output.token_ids)
            self._finished_lengths.append((self.order.finished(request, length), length))
        return output

    async def _generate_probed(self, request: OrderedRequest, prompt_ids, sampling_params, request_id, total: int,
                               kwargs: dict):
        """The probe, then (unless it ended the sample) the rest at its own prediction's priority, joined."""
        self._track_finish_reasons()
        k = self.order.probe_tokens
        probe_params, rest_params = probe.split_params(sampling_params, total, k)
        probe_id = f"{request_id}-probe"
        self._probe_ids.add(probe_id)
        try:
            head = await super().generate(prompt_ids, probe_params, probe_id, priority=request.priority, **kwargs)
        finally:
            self._probe_ids.discard(probe_id)
        self._counts["probes"] += 1
        reason = self._finish_reasons.pop(probe_id, None)
        if head.stop_reason != "completed" or reason != "length" or len(head.token_ids) < k:
            return head  # the sample ended within its probe (or was aborted: verl resumes it from its tokens)
        self._counts["probe_continuations"] += 1
        priority = self.order.after_probe(request, TokenWindow(list(head.token_ids), head.log_probs))
        rest = await super().generate(list(prompt_ids) + list(head.token_ids), rest_params, request_id,
                                      priority=priority, **kwargs)
        return probe.join(head, rest)

    def _max_tokens(self, prompt_ids, sampling_params) -> int:
        """The response budget verl's ``generate`` gives this request (its ``max_tokens``, else the rollout's)."""
        room = int(self.config.max_model_len) - len(prompt_ids)
        total = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if total is None:
            total = min(int(self.config.response_length),
                        int(self.config.prompt_length) + int(self.config.response_length) - len(prompt_ids))
        return max(1, min(int(total), room))

    def _track_finish_reasons(self) -> None:
        """Record vLLM's finish reason of each probe (verl's ``generate`` maps both "stop" and "length" to
        "completed"; only "length" means the sample goes on)."""
        engine = self.engine
        if getattr(engine, "_infsample_finish_reasons", None) is self._finish_reasons:
            return
        generate = engine.generate
        reasons, probes = self._finish_reasons, self._probe_ids

        async def generate_recording(*args, request_id, **kw):
            last = None
            async for out in generate(*args, request_id=request_id, **kw):
                last = out
                yield out
            if request_id in probes and last is not None and last.outputs:
                reasons[request_id] = last.outputs[0].finish_reason

        engine.generate = generate_recording
        engine._infsample_finish_reasons = reasons

    async def set_global_steps(self, global_steps: int):
        """verl's weight sync, before each step's rollout: a new step, its groups counted afresh."""
        await super().set_global_steps(global_steps)
        self.order.new_step()

    async def pop_finished_lengths(self) -> list[tuple[str, int]]:
        """(``prompt_key``, length) of each sample finished since the last call, for the group-affinity router."""
        lengths = list(self._finished_lengths)
        self._finished_lengths.clear()
        return lengths

    async def pop_step_metrics(self) -> dict:
        """The ``infsample/*`` figures of the engine steps since the last call (``vllm_stats``), the probes
        among them (a probed sample is two vLLM requests: ``samples`` counts it once)."""
        metrics = vllm_stats.pop_step_metrics()
        counts, self._counts = self._counts, Counter()
        if metrics and "infsample/samples" in metrics:
            metrics["infsample/samples"] -= counts["probe_continuations"]
        metrics.update({f"infsample/{k}": v for k, v in counts.items()})
        return metrics


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
