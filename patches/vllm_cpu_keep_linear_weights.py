"""CPU runs (opt-in only): vLLM's CPU linear layers drop their weights after loading, so new weights load nowhere.

What: ``UnquantizedLinearMethod.process_weights_after_loading`` (``vllm/model_executor/layers/linear.py``) pre-packs
each linear weight for the CPU GEMM kernels with ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``,
which replaces ``layer.weight`` by an empty Parameter. Every later ``model.load_weights`` (verl's weight sync, or
``VLLMEngine.load_weights``) then fails ("'Parameter' object has no attribute 'weight_loader'") or loads into
nothing while the packed copy keeps decoding with the old weights. The patched method passes
``remove_weight=False`` on the CPU: the weight stays, loads land in it, and the second
``process_weights_after_loading`` that verl runs after the last bucket re-packs from it. The
cost is a second copy of the linear weights in host memory. Every other platform goes to vLLM's method unchanged.

Why a patch: the argument is a literal inside the method; no vLLM option keeps the weight.
"""

TARGET = "vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading"
# sha256 of the dedented source of the target, per vLLM series (checked before applying; tests/test_vllm_engine.py)
SOURCE_SHA256 = {"0.24": "41a1f3f762722344cf4937c2ef3ff8af88c684bb1755652fdd3ecde5b1d4ac1e",
                 "0.32": "f66c4333e1186928e14ad5f30fef4d384905694f557f2247ea2c930daccbb21e"}


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once

    def wrap(original):
        def process_weights_after_loading(self, layer) -> None:
            if not module.current_platform.is_cpu() or getattr(layer, "_cpu_skip_gemm_dispatch", False):
                return original(self, layer)
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

        return process_weights_after_loading

    wrap_once(module.UnquantizedLinearMethod, "process_weights_after_loading", wrap)
