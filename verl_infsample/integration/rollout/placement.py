"""Where a rollout server runs and how the workers find it: its actor name, and the node and devices of the workers
of its replica (verl's vLLM replica places its servers the same way)."""

from __future__ import annotations

from dataclasses import dataclass

import ray


def server_name(replica_rank: int, name_suffix: str = "") -> str:
    """The actor name a worker-side adapter looks its server up by."""
    return f"infinite_server_{replica_rank}_0{name_suffix}"


def cluster_has_accelerators(platform) -> bool:
    """The Ray cluster offers the platform's accelerators (the CPU platform's logical GPUs do not count)."""
    return platform.device_name != "cpu" and ray.cluster_resources().get(platform.ray_resource_name(), 0) > 0


@dataclass(frozen=True)
class WorkerPlacement:
    """Where a replica's workers are: the node, and their accelerator ids (empty where a worker has none)."""

    node_id: str
    device_ids: tuple[str, ...]

    @classmethod
    def of(cls, workers: list[tuple[str, list[str]]], replica_rank: int) -> "WorkerPlacement":
        """From each worker's (node id, accelerator ids); a replica's workers must share one node."""
        nodes = sorted({node for node, _ in workers})
        if len(nodes) != 1:
            raise ValueError(f"rollout replica {replica_rank}: its {len(workers)} workers span {len(nodes)} nodes; the "
                             "infinite backend runs one server per replica, on one node: lower "
                             "actor_rollout_ref.rollout.tensor_model_parallel_size (x data/pipeline parallel) to "
                             "the GPUs of one node, and scale out with more replicas")
        ids = tuple(str(i[0]) for _, i in workers if i)
        return cls(nodes[0], ids if len(ids) == len(workers) else ())
