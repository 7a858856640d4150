"""Which engine serves ``rollout.name=infinite``, and the pieces verl builds for it: the driver-side replica
(``make_replica``, verl's replica registry) and the worker-side adapter (``make_rollout_adapter``, verl's rollout
registry). Both answer from the rollout config alone, the same on the driver and on every worker, so the two sides
always agree on the engine.

- vLLM: verl's own vLLM replica and ``ServerAdapter`` around ``vllm.server.InfiniteVLLMServer`` (verl's vLLM
  server with our request order);
- transformers: ``transformers.replica.TransformersReplica`` and ``transformers.adapter.TransformersRolloutAdapter``
  around ``transformers.server.InfiniteServer`` (our scheduler and engine).
"""

from __future__ import annotations

import ray

from .placement import cluster_has_accelerators


def rollout_engine(config) -> str:
    """The engine ``rollout.name=infinite`` decodes with: ``custom.engine``, where ``auto`` is vLLM when the cluster
    has the platform's accelerators and vLLM is installed (``settings.choose_engine``), else the transformers
    engine."""
    import importlib.util

    from verl.plugin.platform import get_platform

    from ..settings import choose_engine, settings_from_rollout

    engine = settings_from_rollout(config).engine
    if engine != "auto":
        return engine
    accelerator = ray.is_initialized() and cluster_has_accelerators(get_platform())
    return choose_engine(engine, accelerator=accelerator, vllm_installed=importlib.util.find_spec("vllm") is not None)


def make_replica(*args, **kwargs):
    """verl's replica for ``rollout.name=infinite`` (called as verl calls a replica class: ``replica_rank``,
    ``config`` the rollout config, ``model_config``, ...)."""
    config = kwargs.get("config", args[1] if len(args) > 1 else None)
    if config is None:
        raise TypeError("make_replica needs the rollout config (config=...), as verl passes it")
    if rollout_engine(config) == "vllm":
        from .vllm.server import InfiniteVLLMReplica

        return InfiniteVLLMReplica(*args, **kwargs)
    from .transformers.replica import TransformersReplica

    return TransformersReplica(*args, **kwargs)


def make_rollout_adapter(config, model_config, device_mesh=None, *args, replica_rank: int | None = None, **kwargs):
    """The worker-side ``BaseRollout`` verl's training workers hold for ``rollout.name=infinite`` (called as verl
    calls a rollout class)."""
    if rollout_engine(config) == "vllm":
        from verl.workers.rollout.vllm_rollout import ServerAdapter

        return ServerAdapter(config, model_config, device_mesh, replica_rank=-1 if replica_rank is None
                             else replica_rank)
    from .transformers.adapter import TransformersRolloutAdapter

    return TransformersRolloutAdapter(config, model_config, device_mesh, *args, replica_rank=replica_rank, **kwargs)
