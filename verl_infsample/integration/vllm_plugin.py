"""vLLM's ``vllm.general_plugins`` entry point: the opt-in CPU patches of ``patches/vllm_cpu_*.py``.

vLLM calls :func:`load` in every process it starts (the engine core, each worker) and in the one that builds the
engine, before it builds a model, so a patch reaches code that runs far from the process that asked for it. Without
the CPU opt-in (``VERL_INFSAMPLE_CPU=1`` or ``VERL_PLATFORM=cpu``) nothing is patched.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_loaded = False


def load() -> None:
    global _loaded
    from .cpu import VLLM_PATCHES, arm_patches, opted_in

    if _loaded or not opted_in():
        return
    arm_patches(VLLM_PATCHES)
    _loaded = True
    logger.info("verl-infsample: vLLM CPU patches armed (%s)", VLLM_PATCHES)
