"""``TransformersRolloutAdapter``: the worker-side ``BaseRollout`` verl's training workers hold on the transformers
engine (on vLLM, ``factory.make_rollout_adapter`` gives verl's own vLLM ``ServerAdapter``). verl syncs weights
every step through it: ``resume(["weights"])``, ``update_weights(generator)``, then ``resume(["kv_cache"])``. Every rank must drain the generator (it all-gathers); the rank that owns a server sends the
tensors to it over Ray in buckets, so the server decodes the next step with the new weights.
"""

from __future__ import annotations

import os

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from ..placement import server_name

BUCKET_BYTES = 256 << 20


class TransformersRolloutAdapter(BaseRollout):
    """The worker side of one ``InfiniteServer``: weights, sleep and wake-up, by Ray calls to its actor."""

    def __init__(self, config, model_config, device_mesh=None, *args, replica_rank: int | None = None, **kwargs):
        super().__init__(config, model_config, device_mesh)
        if replica_rank is None:  # hybrid mode: one replica per tensor-parallel group of ranks (tp=1: one per rank)
            tp = max(1, int(getattr(self.config, "tensor_model_parallel_size", 1) or 1))
            replica_rank = int(os.environ.get("RANK", 0)) // tp
        self.replica_rank = replica_rank
        self.sends = int(os.environ.get("RANK", 0)) % max(1, int(getattr(self.config, "tensor_model_parallel_size",
                                                                          1) or 1)) == 0
        self._server = None

    @property
    def server(self):
        if self._server is None:  # the server actor is created after this adapter: look it up lazily
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        await self.server.wake_up.remote(tags=tags)

    async def release(self):
        await self.server.sleep.remote()

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the infinite rollout takes full named tensors, not {wire_format!r}")
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        loaded = 0
        for name, tensor in weights:  # drain it all, on every rank
            if not self.sends:
                continue
            bucket[name] = tensor.detach().to("cpu", copy=True)
            size += bucket[name].numel() * bucket[name].element_size()
            if size >= BUCKET_BYTES:
                loaded += await self.server.update_weights.remote(bucket)
                bucket, size = {}, 0
        if self.sends and bucket:
            loaded += await self.server.update_weights.remote(bucket)
        if self.sends and kwargs.get("global_steps") is not None:
            await self.server.set_global_steps.remote(kwargs["global_steps"])
        return loaded
