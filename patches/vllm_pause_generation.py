"""vLLM 0.32, on any device: verl 0.9.1 pauses vLLM with a keyword vLLM 0.32 no longer takes.

What: verl's ``vLLMHttpServer.abort_all_requests`` (how its asynchronous trainer modes stop a rollout before a weight
sync) calls ``AsyncLLM.pause_generation(wait_for_inflight_requests=False, clear_cache=...)``, the signature of the
vLLM that verl 0.9.1 pins (0.24). vLLM 0.32 says the same with ``mode="abort"`` (or ``"wait"``) and raises a
TypeError on the old keyword, so every abort fails. The patched method maps the old keyword onto the new one and
leaves every other call as it was. On vLLM 0.24 nothing is changed (``needed``).

Why a patch: the keyword is a literal inside verl's method. Armed in every vLLM process, GPU or CPU
(``verl_infsample.integration.vllm_plugin``).
"""

TARGET = "vllm.v1.engine.async_llm:AsyncLLM.pause_generation"
# sha256 of the dedented source of the target, per vLLM series (checked before applying; tests/test_vllm_engine.py)
SOURCE_SHA256 = {"0.32": "b4a3216380cac390b6f450b3c20ae62fda5775af00fb77517a4e993e024fbce0"}


def needed(module) -> bool:
    from verl_infsample.integration.vllm_versions import pause_generation_takes_mode

    return pause_generation_takes_mode(module.AsyncLLM)


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once

    def wrap(original):
        async def pause_generation(self, *, wait_for_inflight_requests: bool | None = None, **kwargs) -> None:
            if wait_for_inflight_requests is not None:
                kwargs.setdefault("mode", "wait" if wait_for_inflight_requests else "abort")
            return await original(self, **kwargs)

        return pause_generation

    wrap_once(module.AsyncLLM, "pause_generation", wrap)
