"""CPU runs (opt-in only): verl's default process-group backend names the CPU twice.

What: ``verl.utils.distributed.initialize_global_process_group_ray(timeout_second=None, backend=None)`` builds the
default backend ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``. With the CPU platform that is
``"cpu:gloo,cpu:gloo"``, which ``torch.distributed.init_process_group`` rejects ("Duplicate device type cpu").
The patched function passes ``backend="cpu:gloo"`` when the caller gave none and the platform's device is the CPU;
anything else goes to verl's function unchanged.

Why a patch: the string is built inside the function; no platform method can make the two halves differ.
Callers (``verl.workers.engine_workers``) import the function by name, so it is replaced in ``verl.utils.distributed``
as soon as that module is imported, before they bind it.
"""

TARGET = "verl.utils.distributed:initialize_global_process_group_ray"
# sha256 of the dedented source of the target in verl 0.9.1 (checked before applying; tests/test_cpu_platform.py too)
SOURCE_SHA256 = "761a94d1a2e058d31a0ac231c89a142abf5daf822e333bac75e84cafcf7507ac"


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once

    def wrap(original):
        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            if backend is None and module.get_device_name() == "cpu":
                backend = "cpu:gloo"
            return original(timeout_second=timeout_second, backend=backend)

        return initialize_global_process_group_ray

    wrap_once(module, "initialize_global_process_group_ray", wrap)
