"""vLLM's ``vllm.general_plugins`` entry point: the opt-in CPU patches of ``patches/vllm_cpu_*.py``, and on any CPU
the fix to vLLM's CPU rejection sampler (``patches/vllm_cpu_expand_kernel.py``), without which drafts change what is
sampled.

vLLM calls :func:`load` in every process it starts (the engine core, each worker) and in the one that builds the
engine, before it builds a model, so a patch reaches code that runs far from the process that asked for it. Without
the CPU opt-in (``VERL_INFSAMPLE_CPU=1`` or ``VERL_PLATFORM=cpu``) only the sampler fix is armed, and only on a CPU.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_loaded = False


EXACT_SAMPLING_PATCH = "vllm_cpu_expand_kernel.py"  # vLLM's CPU rejection sampler: armed on every CPU, opt-in or not


def load() -> None:
    global _loaded
    if _loaded:
        return
    from .cpu import PATCHES_DIR, VLLM_PATCHES, arm_patches, opted_in

    _loaded = True
    if opted_in():
        arm_patches(VLLM_PATCHES)
        logger.info("verl-infsample: vLLM CPU patches armed (%s)", VLLM_PATCHES)
    elif _vllm_on_cpu() and (PATCHES_DIR / EXACT_SAMPLING_PATCH).is_file():
        arm_patches(EXACT_SAMPLING_PATCH)  # drafts verified on the CPU must keep the sampled law
        logger.info("verl-infsample: vLLM's CPU rejection sampler patched (%s)", EXACT_SAMPLING_PATCH)


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
