"""``TransformersReplica``: verl's driver-side handle on one ``InfiniteServer`` actor (the transformers engine).

Placement follows verl's vLLM replica (``vLLMReplica.launch_servers``): in hybrid mode the server goes to the node of
its replica's workers and sees their devices (``CUDA_VISIBLE_DEVICES`` set to the workers' accelerator ids, with
Ray told not to reset it), so every replica decodes on its own GPUs; in standalone mode a vLLM server asks Ray for
its replica's GPUs itself. One server per replica: a replica must fit on one node (more replicas scale out).
"""

from __future__ import annotations

import asyncio

import ray
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from ..placement import WorkerPlacement, cluster_has_accelerators, server_name
from ..requests import REQUESTS_IN_FLIGHT
from .server import InfiniteServer


class TransformersReplica(RolloutReplica):
    """The replica of ``rollout.name=infinite`` on the transformers engine: one ``InfiniteServer`` per replica."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        layout = {key: int(getattr(self.config, key, 1) or 1)
                  for key in ("data_parallel_size", "pipeline_model_parallel_size")}
        if any(size > 1 for size in layout.values()):
            key = next(k for k, size in layout.items() if size > 1)
            raise ValueError(f"actor_rollout_ref.rollout.{key}={layout[key]}: the transformers engine of the infinite "
                             "rollout runs one replica per tensor-parallel group; set it to 1 and scale out with "
                             "more replicas, or decode with actor_rollout_ref.rollout.custom.engine=vllm")

    @property
    def max_concurrency(self) -> int:
        return max(super().max_concurrency, REQUESTS_IN_FLIGHT)

    async def init_standalone(self):
        """Standalone replicas need no accelerator pool or checkpoint-engine workers: the server loads the model."""
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def _worker_placement(self) -> WorkerPlacement | None:
        if not self.workers:
            return None
        from verl.utils.device import get_resource_name

        resource = get_resource_name()
        infos = await asyncio.gather(*[w.__ray_call__.remote(
            lambda _, r=resource: (ray.get_runtime_context().get_node_id(),
                                   list(ray.get_runtime_context().get_accelerator_ids().get(r, []))))
            for w in self.workers])
        return WorkerPlacement.of(list(infos), self.replica_rank)

    async def launch_servers(self):
        from verl.plugin.platform import get_platform
        from verl.utils.device import get_visible_devices_keyword

        name = server_name(self.replica_rank, self.name_suffix)
        platform = get_platform()
        env = {"TOKENIZERS_PARALLELISM": "false"}
        options: dict = dict(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
        kwargs: dict = {}
        placement = await self._worker_placement()
        if placement is not None:  # hybrid / colocated: on the workers' node, with their devices
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=placement.node_id, soft=False)
            env.update({var: "1" for var in platform.ray_noset_envvars()})
            env.update(platform.rollout_env_vars())
            if placement.device_ids:
                kwargs["visible_devices"] = (get_visible_devices_keyword(), ",".join(placement.device_ids))
        elif cluster_has_accelerators(platform):
            # standalone on accelerators: the server holds its replica's GPUs itself, and either engine decodes on them
            options.update(platform.ray_resource_options(self.world_size))
        server = ray.remote(InfiniteServer).options(**options, runtime_env={"env_vars": env}).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank, **kwargs)
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"infinite://{name}"  # unique per replica: verl's load balancer keys on it
