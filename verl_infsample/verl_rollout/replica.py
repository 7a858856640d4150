"""``InfiniteReplica``: verl's driver-side handle on one ``InfiniteServer`` actor."""

from __future__ import annotations

import ray
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from .server import InfiniteServer


def server_name(replica_rank: int, name_suffix: str = "") -> str:
    """The actor name a worker-side adapter looks its server up by."""
    return f"infinite_server_{replica_rank}_0{name_suffix}"


class InfiniteReplica(RolloutReplica):
    async def init_standalone(self):
        """Standalone replicas need no accelerator pool or checkpoint-engine workers: the server loads the model."""
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def launch_servers(self):
        name = server_name(self.replica_rank, self.name_suffix)
        server = ray.remote(InfiniteServer).options(
            name=name, num_cpus=0, max_concurrency=self.max_concurrency,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"infinite://{name}"  # unique per replica: verl's load balancer keys on it
