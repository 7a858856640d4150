"""Registration with verl. ``import verl`` loads this module through the ``verl.plugins`` entry point, in every
process (Ray workers included), and registers on import; user code may call ``register()`` itself (idempotent).

``register()`` puts the rollout backend ``infinite`` into verl's registries (worker-side rollout class, driver-side
replica class), the V1 trainer mode ``infinite_sync`` (once verl imports its V1 trainers), and checks
``actor_rollout_ref.rollout.custom.*`` when verl validates its config, before Ray starts.
CPU runs opt in with ``VERL_INFSAMPLE_CPU=1`` (or ``VERL_PLATFORM=cpu``): the CPU platform and its patches go in
first, before anything asks verl for its platform. Without the opt-in nothing of the CPU mode runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .cpu import activate, opted_in

ROUTERS = {"group_affinity": "integration/rollout/group_affinity_router.yaml"}
logger = logging.getLogger(__name__)
_registered = False


def register() -> None:
    """Register ``rollout.name=infinite`` with verl (worker-side rollout class, driver-side replica class) and the
    V1 trainer mode ``infinite_sync`` (once verl imports its V1 trainers), and check
    ``actor_rollout_ref.rollout.custom.*`` when verl validates its config, before Ray starts."""
    global _registered
    if _registered:
        return
    from verl.utils import config as verl_config
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[("infinite", "async")] = "verl_infsample.integration.rollout.factory.make_rollout_adapter"

    def load_replica():
        from .rollout.factory import make_replica

        return make_replica

    RolloutReplicaRegistry.register("infinite", load_replica)
    from omegaconf import OmegaConf

    # configs/infinite_grpo.yaml: router_config_path: ${infsample.router_config:group_affinity,<engine>,<device>}
    OmegaConf.register_new_resolver("infsample.router_config", router_config_path, replace=True)
    # trainer.v1.trainer_mode=infinite_sync (integration.balance): registered in whichever process imports verl's V1
    # trainers (the TaskRunner actor), when it does, so no other process pays for that import.
    from .import_hooks import when_imported

    when_imported("verl.trainer.ppo.v1", _register_trainer_mode)
    if not getattr(verl_config.validate_config, "_infsample", False):
        verl_config.validate_config = _validating(verl_config.validate_config)
    _registered = True
    logger.info("verl-infsample %s registered rollout backend 'infinite'", _version())


def router_config_path(name: str = "group_affinity", engine: str | None = None, device: str | None = None) -> str | None:
    """Absolute path of a router yaml shipped with the package, for ``actor_rollout_ref.rollout.router_config_path``
    (verl's router hook; ``group_affinity``: ``integration.rollout.router.GroupAffinityRouter``).

    Given the rollout's ``custom.engine`` (and ``trainer.device``, which ``auto`` follows), None where the engine is
    vLLM: there each server orders its samples by their own predictions, and verl's router, which spreads requests
    evenly, keeps the replicas' work even; placing whole groups by their prompt's history does not (``infsample
    replay --router``)."""
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; choose one of: {', '.join(ROUTERS)}")
    if engine is not None:
        import importlib.util

        from .settings import choose_engine

        if choose_engine(engine, accelerator=str(device or "cuda") != "cpu",
                         vllm_installed=importlib.util.find_spec("vllm") is not None) == "vllm":
            return None
    return str(Path(__file__).resolve().parent.parent / ROUTERS[name])


def _register_trainer_mode(_v1_module) -> None:
    """Runs inside verl's import of ``verl.trainer.ppo.v1``: a failure here is logged, never raised into verl."""
    import importlib

    try:
        importlib.import_module("verl_infsample.integration.balance")  # registers on import (idempotent)
    except Exception:  # noqa: BLE001 - verl must keep working without our trainer mode
        logger.warning("verl-infsample: could not register trainer mode 'infinite_sync'", exc_info=True)


def _validating(validate_config):
    """Ours for rollout.name=infinite, then verl's validate_config: a bad custom key fails before Ray starts."""

    def validate(config, *args, **kwargs):
        rollout = config.actor_rollout_ref.rollout
        if rollout.get("name") == "infinite":
            import importlib.util

            from .settings import (check_speculative, check_transformers_engine_serves, check_vllm_engine_serves,
                                   choose_engine, settings_from_rollout, vllm_ordering)

            settings = settings_from_rollout(rollout)
            if settings.engine == "vllm":  # with auto, the server checks once the engine is known
                vllm_ordering(settings)
            engine = choose_engine(settings.engine, accelerator=str(config.trainer.get("device", "cuda")) != "cpu",
                                   vllm_installed=importlib.util.find_spec("vllm") is not None)
            check_speculative(settings, engine, (rollout.get("engine_kwargs") or {}).get("vllm"), rollout.get("mtp"))
            if engine == "transformers":
                check_transformers_engine_serves(config)
            else:
                check_vllm_engine_serves(config)
            if rollout.get("router_config_path"):
                _check_router_config(rollout.router_config_path)
        return validate_config(config, *args, **kwargs)

    validate._infsample = True
    validate.__wrapped__ = validate_config
    validate.__doc__ = validate_config.__doc__
    return validate


def _check_router_config(path: str) -> None:
    """Our router's yaml keys, before Ray starts (another router class is verl's or its author's business)."""
    from omegaconf import OmegaConf

    from verl.utils.import_utils import resolve_config_path

    config = OmegaConf.to_container(OmegaConf.load(resolve_config_path(path)), resolve=True)
    if config.get("router_class") == "verl_infsample.integration.rollout.router.GroupAffinityRouter":
        from .rollout.router import GroupAffinityConfig

        GroupAffinityConfig.from_yaml(config, source=f"actor_rollout_ref.rollout.router_config_path={path}")


def _version() -> str:
    from importlib.metadata import version

    return version("verl-infsample")


if opted_in():
    activate()

register()
