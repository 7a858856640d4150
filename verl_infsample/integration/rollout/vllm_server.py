"""``rollout.name=infinite`` on vLLM: verl's own vLLM server, with the plan's order in front of vLLM's scheduler.

:class:`InfiniteVLLMServer` is verl's ``vLLMHttpServer``, so everything verl's vLLM rollout does comes with it
unchanged: the engine it builds from the rollout config (tensor, data and expert parallelism, quantization, LoRA),
its weight transfer from the training workers (verl's own ``ServerAdapter`` on the worker side, see
``adapter.InfiniteRolloutAdapter``), sleep and wake-up, abort and resume, every sampling parameter verl sends, and
multi-turn prompts that reuse their KV through vLLM's prefix cache. What it adds is the scheduling:

- vLLM runs with ``scheduling_policy=priority`` and prefix caching, and each request gets the priority of its
  sample's place in the plan (``core.priority.StepPriorities``: groups together, longest predicted first; the
  prediction is the prompt's ``custom.predictor`` history), so vLLM's continuous batching refills freed slots in
  the plan's order and keeps a group on its prompt's cached blocks;
- ``custom.slots`` is vLLM's ``max_num_seqs`` (samples decoded at once);
- the step's figures (engine steps, preemptions, tokens computed, peak KV blocks, the engine's own wall time) come
  from vLLM's per-step stats (``vllm_stats``) for the ``infinite_sync`` trainer to log, and the lengths of finished
  samples for the group-affinity router (``pop_finished_lengths``).
"""

from __future__ import annotations

from collections import deque

import ray
from verl.workers.rollout.vllm_rollout import vllm_async_server as _verl_vllm
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from ...predict import make_predictor
from ..settings import settings_from_rollout, vllm_ordering
from . import vllm_stats
from .server import FINISHED_LENGTHS_KEPT, REQUESTS_IN_FLIGHT
from .vllm_order import VLLMRequestOrder

vllm_stats.instrument(_verl_vllm)  # this process builds our server's AsyncLLM: it carries the step's figures


class InfiniteVLLMServer(vLLMHttpServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = settings_from_rollout(self.config)
        self.order = VLLMRequestOrder(vllm_ordering(self.settings),
                                      make_predictor(self.settings.predictor, max_len=int(self.config.response_length)))
        self._finished_lengths: deque[tuple[str, int]] = deque(maxlen=FINISHED_LENGTHS_KEPT)

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        engine_kwargs["scheduling_policy"] = "priority"
        engine_kwargs["enable_prefix_caching"] = True
        if self.settings.slots is not None:
            engine_kwargs["max_num_seqs"] = self.settings.slots

    async def generate(self, prompt_ids, sampling_params, request_id, *args, priority: int = 0, **kwargs):
        """verl's ``generate`` at the plan's priority (the caller's ``priority`` orders what the plan ranks equal)."""
        priority = self.order.priority(prompt_ids, caller=priority)
        output = await super().generate(prompt_ids, sampling_params, request_id, *args, priority=priority, **kwargs)
        if output.stop_reason == "completed":
            length = len(output.token_ids)
            self._finished_lengths.append((self.order.finished(prompt_ids, length), length))
        return output

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
        """The ``infsample/*`` figures of the engine steps since the last call (``vllm_stats``)."""
        return vllm_stats.pop_step_metrics()


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
