"""vLLM on the CPU: top-k without top-p fails on a step whose batch has no draft positions, so a request with
``top_k`` and drafts on stops the engine.

What: without Triton (the CPU), ``apply_top_k_top_p`` takes ``apply_top_k_only`` (vllm/v1/sample/ops/
topk_topp_sampler.py) when only top-k is set, and that function reduces ``k.max()`` with no dimension, which raises
on an empty tensor. The rejection sampler applies the sampling constraints to the draft positions' logits every
step drafts are on, also when no row drafted this step (zero positions): the first such step with a ``top_k``
request raises. The patched function returns an empty batch as it is and leaves every other call to vLLM's.

Why a patch: the function is vLLM's CPU path (a GPU runs the Triton kernel). Armed with the other
``vllm_cpu_sampler_*.py`` fixes in every vLLM process on the CPU (integration.vllm_plugin), opt-in or not.
"""

TARGET = "vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_only"
# sha256 of the dedented source of the target, per vLLM series (checked before applying; tests/test_vllm_engine.py)
SOURCE_SHA256 = {"0.24": "e13faa4d396c7384e3ca924cfac996334f89e9cb41f82d69dc2ffd6e50c18dc3",
                 "0.32": "4af02a4dad88c663c45133442ce31e091546a9e164eaa8f22244c30dca3220bb"}


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once

    def wrap(original):
        def apply_top_k_only(logits, k):
            if logits.shape[0] == 0:
                return logits
            return original(logits, k)

        return apply_top_k_only

    wrap_once(module, "apply_top_k_only", wrap)
