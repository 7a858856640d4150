"""Loaded by ``import verl`` through the lab's own ``verl.plugins`` entry point, in every process: the hooks
``infsample bench-verl`` arms in verl's own vLLM server, so both backends report the same figures and draw the
same tokens. The plugin itself installs none of them; each acts only where its variable is set."""

from __future__ import annotations

import os

from verl_infsample.integration.import_hooks import when_imported
from verl_infsample.integration.rollout.vllm import stats as vllm_stats

from .bench.request_seeds import seed_requests_when_asked


def instrument_when_asked() -> None:
    """With ``VERL_INFSAMPLE_VLLM_STATS=1``, verl's vLLM server reports the step figures ours does, wherever it is
    imported."""
    if os.environ.get(vllm_stats.STATS_ENV) == "1":
        when_imported(vllm_stats.SERVER_MODULE, vllm_stats.instrument)


instrument_when_asked()
seed_requests_when_asked()
