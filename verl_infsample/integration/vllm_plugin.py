"""vLLM's ``vllm.general_plugins`` entry point: the opt-in CPU patches of ``patches/vllm_cpu_*.py``; on any CPU the
fixes to vLLM's CPU rejection sampler (``patches/vllm_cpu_sampler_*.py``), without which drafts change what is
sampled or stop the engine; on any device the patches every vLLM needs where verl 0.9.1 meets it (``VLLM_ANY_DEVICE``: verl's pause
keyword on vLLM 0.32, a no-op on 0.24).

vLLM calls :func:`load` in every process it starts (the engine core, each worker) and in the one that builds the
engine, before it builds a model, so a patch reaches code that runs far from the process that asked for it. Without
the CPU opt-in (``VERL_INFSAMPLE_CPU=1`` or ``VERL_PLATFORM=cpu``) only the sampler fixes are armed, and only on a CPU.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_loaded = False


EXACT_SAMPLING_PATCHES = "vllm_cpu_sampler_*.py"  # vLLM's CPU rejection sampler: armed on every CPU, opt-in or not
VLLM_ANY_DEVICE = "vllm_pause_generation.py"  # armed on every device; each patch's ``needed`` says where it acts


def armed_here() -> list[str]:
    """The ``patches/`` files this process arms in vLLM: verl's pause keyword on every device, the CPU patches on
    opt-in, the sampler fixes on any CPU."""
    from .cpu import VLLM_PATCHES, opted_in

    if opted_in():
        return [VLLM_ANY_DEVICE, VLLM_PATCHES]
    return [VLLM_ANY_DEVICE] + ([EXACT_SAMPLING_PATCHES] if _vllm_on_cpu() else [])


def load() -> None:
    global _loaded
    if _loaded:
        return
    from .cpu import arm_patches

    _loaded = True
    patterns = armed_here()
    for pattern in patterns:
        arm_patches(pattern)
    logger.info("verl-infsample: vLLM patches armed (%s)", ", ".join(patterns))


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
