"""verl-infsample: Infinite Sampling for verl. GRPO's group size, decoupled from GPU memory.

``register()`` puts the rollout backend ``infinite`` into verl's registries; verl calls it through the
``verl.plugins`` entry point, and user code may call it too (it is idempotent). ``router_config_path()`` names the
group-affinity router's yaml for ``actor_rollout_ref.rollout.router_config_path``. Both live in
``integration.plugin``, imported only when called, so ``import verl_infsample`` stays light.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["register", "router_config_path", "__version__"]


VERL_INSTALL_HINT = ('pip install "verl-infsample[gpu]" brings verl 0.9.1 with its vLLM (README, Install); '
                     "`infsample doctor` checks the whole set-up")


def register() -> None:
    """Register ``rollout.name=infinite`` with verl (see ``integration.plugin``)."""
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        raise ModuleNotFoundError(f"verl_infsample.register(): verl is not installed; {VERL_INSTALL_HINT}",
                                  name="verl")
    from .integration.plugin import register as register_with_verl

    register_with_verl()


def router_config_path(name: str = "group_affinity", engine: str | None = None, device: str | None = None) -> str | None:
    """Absolute path of a router yaml shipped with the package (see ``integration.plugin.router_config_path``)."""
    from .integration.plugin import router_config_path as path

    return path(name, engine, device)
