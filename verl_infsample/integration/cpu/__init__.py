"""verl on the CPU, opt-in: a CPU platform through verl's platform plugin API, plus the smallest patches.

Opt in with ``VERL_INFSAMPLE_CPU=1`` (which also selects ``VERL_PLATFORM=cpu``) or with ``VERL_PLATFORM=cpu``, in
the environment of the driver (local Ray workers inherit it). ``verl_infsample.integration.plugin`` (loaded by ``import verl``)
then calls :func:`activate` in every process, before it registers the rollout backend. Without the opt-in nothing
here runs: no platform is registered, no verl function is replaced, verl behaves as without the plugin.

What :func:`activate` does:

* registers :class:`~verl_infsample.integration.cpu.platform.PlatformCPU` as platform ``"cpu"``
  (``PlatformRegistry.register``; verl's hook for new hardware);
* registers verl's FSDP engines for device ``"cpu"`` (``EngineRegistry.register``; verl registers them for cuda and
  npu only), once verl imports them;
* applies the patches in ``<repo>/patches/verl_cpu_*.py`` (each says what it changes and why), each when verl
  imports its target module.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import textwrap
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

ENV_OPT_IN = "VERL_INFSAMPLE_CPU"
# The repository's patches/, shipped inside the package as verl_infsample/patches (a link in the checkout)
PATCHES_DIR = Path(__file__).resolve().parents[2] / "patches"
VERL_PATCHES = "verl_cpu_*.py"  # applied by activate(), when verl imports each target
VLLM_PATCHES = "vllm_cpu_*.py"  # applied by verl_infsample.integration.vllm_plugin, in every vLLM process

_active = False


def opted_in(environ=None) -> bool:
    env = os.environ if environ is None else environ
    flag = env.get(ENV_OPT_IN, "").strip().lower() in ("1", "true", "yes", "on")
    return flag or env.get("VERL_PLATFORM", "").strip().lower() == "cpu"


def load_patches(pattern: str = VERL_PATCHES) -> list[ModuleType]:
    """The patch modules matching ``pattern``, loaded from their files, each under a name of its own."""
    if not PATCHES_DIR.is_dir():
        raise RuntimeError(f"the plugin's patches are not at {PATCHES_DIR}: reinstall verl-infsample (README, Install)")
    mods = []
    for path in sorted(PATCHES_DIR.glob(pattern)):
        name = f"verl_infsample_patches.{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods


def resolve(target: str):
    """``"pkg.module:Class.attr"`` -> (module, object)."""
    module_name, _, qualname = target.partition(":")
    module = importlib.import_module(module_name)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return module, obj


def source_sha256(obj) -> str:
    """Fingerprint of a function's source (dedented); follows ``__wrapped__`` to verl's own function."""
    while hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    return hashlib.sha256(textwrap.dedent(inspect.getsource(obj)).encode()).hexdigest()


def _register_platform() -> None:
    from verl.plugin.platform import PlatformRegistry, platform_manager

    from .platform import PLATFORM_NAME, PlatformCPU

    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    current = platform_manager._current_platform
    if current is not None and not isinstance(current, PlatformCPU):  # resolved before we got here
        platform_manager.set_platform(PlatformCPU())


def _register_fsdp_engines(module) -> None:
    from verl.workers.engine.base import EngineRegistry

    for model_type, cls in (("language_model", module.FSDPEngineWithLMHead),
                            ("value_model", module.FSDPEngineWithValueHead)):
        registry = EngineRegistry._engines.get(model_type, {})
        if all("cpu" in registry.get(b, {}) for b in ("fsdp", "fsdp2")):
            continue
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(cls)


def wrap_once(owner, name: str, wrap) -> None:
    """Replace ``owner.<name>`` with ``wrap(original)``, once: the replacement is marked ``_infsample_cpu``, keeps the
    original as ``__wrapped__`` (which :func:`source_sha256` follows) and its docstring; a marked one stays."""
    original = getattr(owner, name)
    if getattr(original, "_infsample_cpu", False):
        return
    replacement = wrap(original)
    replacement._infsample_cpu = True
    replacement.__wrapped__ = original
    replacement.__doc__ = original.__doc__
    setattr(owner, name, replacement)


class PatchMismatch(RuntimeError):
    """A patch's target is not the code the patch was written for (another verl or vLLM version)."""


def pinned_sha256(patch) -> str | None:
    """The sha256 the patch expects of its target here: its one pin (verl's patches, for verl 0.9.1), or for
    vLLM's patches the pin of the installed vLLM's series (``{"0.24": ..., "0.32": ...}``), None where it has none."""
    pins = patch.SOURCE_SHA256
    if isinstance(pins, str):
        return pins
    from ..vllm_versions import installed_version, series

    version = installed_version()
    return pins.get(series(version)) if version else None


def needed(patch, module) -> bool:
    """Whether the patch has anything to change in ``module`` (a patch may say no, e.g. on a vLLM that already takes
    verl's keyword); a patch without ``needed`` is always needed."""
    return getattr(patch, "needed", lambda _module: True)(module)


def took(patch, module) -> bool:
    """Whether the patch is in place in ``module``: its own ``took`` where it has one, else its target carries the
    mark :func:`wrap_once` leaves."""
    if hasattr(patch, "took"):
        return patch.took(module)
    _, target = resolve(patch.TARGET)
    return getattr(target, "_infsample_cpu", False)


def applying(patch):
    """``patch.apply(module)``, once the patched code is checked to be the code the patch was written for; on another
    version it refuses, naming the patch file and its target."""

    def apply(module) -> None:
        if not needed(patch, module):
            logger.debug("verl-infsample: %s not needed here", Path(patch.__file__).name)
            return
        expected = pinned_sha256(patch)
        try:
            _, target = resolve(patch.TARGET)
            found = source_sha256(target)
        except (AttributeError, OSError, TypeError) as e:
            found = f"unreadable ({e})"
        if found != expected:
            raise PatchMismatch(
                f"patches/{Path(patch.__file__).name}: {patch.TARGET} is not the code this patch was written for "
                f"(sha256 {found}, expected {expected or 'a pin for this version: none'}); install a supported "
                f"version (README, Install) or re-read the patch against this code, or run without {ENV_OPT_IN}")
        patch.apply(module)

    return apply


def arm_patches(pattern: str) -> None:
    """Apply each patch matching ``pattern`` right after its target module is imported (at once if it already is)."""
    from ..import_hooks import when_imported

    for patch in load_patches(pattern):
        when_imported(patch.TARGET.partition(":")[0], applying(patch))


def activate() -> None:
    """Make verl run on the CPU in this process (idempotent). Call only on opt-in."""
    global _active
    if _active:
        return
    os.environ.setdefault("VERL_PLATFORM", "cpu")
    if os.environ["VERL_PLATFORM"].strip().lower() != "cpu":
        raise RuntimeError(f"{ENV_OPT_IN}=1 but VERL_PLATFORM={os.environ['VERL_PLATFORM']!r}: unset one of them")
    from ..import_hooks import when_imported

    _register_platform()
    arm_patches(VERL_PATCHES)
    when_imported("verl.workers.engine.fsdp.transformer_impl", _register_fsdp_engines)
    _active = True
    logger.info("verl-infsample: verl runs on the CPU (platform 'cpu', patches from %s)", PATCHES_DIR)
