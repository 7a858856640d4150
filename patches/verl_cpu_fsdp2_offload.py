"""CPU runs (opt-in only): the FSDP2 engine asks for pinned host memory, which needs an accelerator.

What: ``FSDPEngine._build_fsdp_module`` (``verl/workers/engine/fsdp/transformer_impl.py``) gives forward-only
engines (the reference policy) and ``offload_policy`` engines ``CPUOffloadPolicy(pin_memory=True)``. Pinning fails on
a machine without an accelerator ("Cannot access accelerator device when none is available"). The patch rebinds the
module's global ``CPUOffloadPolicy`` to a factory that returns torch's ``CPUOffloadPolicy`` with
``pin_memory=False``; the engine's code is otherwise untouched (the offload itself is kept, and is harmless when the
compute device is the CPU).

Why a patch: the argument is a literal in the method; no config key or platform method reaches it.
"""

TARGET = "verl.workers.engine.fsdp.transformer_impl:FSDPEngine._build_fsdp_module"
# sha256 of the dedented source of the target in verl 0.9.1 (checked before applying; tests/test_cpu_platform.py too)
SOURCE_SHA256 = "41da6c4ed82d496a178552d687d2b57533ec8d8ce8f350028dbb5fe4fbd6187d"


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once

    if module.CPUOffloadPolicy is None:  # torch before 2.4 (no FSDP2): nothing to change
        return

    def wrap(policy_cls):
        def CPUOffloadPolicy(pin_memory: bool = True, **kwargs):  # noqa: N802 - stands in for the class
            return policy_cls(pin_memory=False, **kwargs)

        return CPUOffloadPolicy

    wrap_once(module, "CPUOffloadPolicy", wrap)


def took(module) -> bool:
    """The module's global is rebound (its target method is not wrapped)."""
    return module.CPUOffloadPolicy is None or getattr(module.CPUOffloadPolicy, "_infsample_cpu", False)
