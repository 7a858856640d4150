"""``PlatformCPU``: verl's platform plugin API (``verl.plugin.platform``) pointed at the CPU.

verl 0.9.1 routes device name, the ``torch.<device>`` module, the collective backend, seeding, memory statistics and
the Ray resource name through ``get_platform()`` (``verl/utils/device.py``), but registers only accelerators
(nvidia, huawei, amd): ``VERL_PLATFORM=cpu`` is rejected. This class fills that slot, so verl's device code runs on
the CPU unchanged: device ``"cpu"``, collectives over gloo, no-op memory/stream calls, and ``current_device()`` ==
``"cpu"`` (verl moves tensors with ``.to(get_device_id())``; an int 0 would mean ``cuda:0``).

Ray: verl asks its placement groups for one accelerator per rank. On CPU those are *logical* GPUs, declared with
``ray.init(num_gpus=N)`` (``+ray_kwargs.ray_init.num_gpus=N``): the resource name stays ``"GPU"``, nothing touches
CUDA.

Registered only on opt-in (``verl_infsample.integration.cpu.activate``), never by importing this module's package.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any, Optional

import torch

from verl.plugin.platform import PlatformBase

PLATFORM_NAME = "cpu"


def _zero(*args, **kwargs) -> int:
    return 0


def _none(*args, **kwargs) -> None:
    return None


def _mem_get_info(*args, **kwargs) -> tuple[int, int]:
    """(free, total) host memory: verl logs it and sizes caches by it."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except Exception:  # noqa: BLE001 - statistics only
        return 0, 0


class _Nvtx:
    @staticmethod
    @contextmanager
    def range(msg, *args, **kwargs):
        yield

    range_push = staticmethod(_none)
    range_pop = staticmethod(_none)
    mark = staticmethod(_none)


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes on ``get_torch_device()``, as no-ops or zeros."""
    mod = types.ModuleType("verl_infsample_cpu_device")
    for name in dir(torch.cpu):  # is_available, synchronize, current_stream, stream, Stream, Event, device_count, ...
        if not name.startswith("_"):
            setattr(mod, name, getattr(torch.cpu, name))
    mod.current_device = lambda: "cpu"
    mod.set_device = _none
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.get_device_name = lambda *a, **k: "cpu"
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_cached", "max_memory_cached"):
        setattr(mod, name, _zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated", "ipc_collect",
                 "set_per_process_memory_fraction"):
        setattr(mod, name, _none)
    mod.mem_get_info = _mem_get_info
    mod.memory_stats = lambda *a, **k: {}
    mod.manual_seed = lambda seed: torch.manual_seed(seed)
    mod.manual_seed_all = lambda seed: torch.manual_seed(seed)
    mod.get_rng_state = lambda *a, **k: torch.get_rng_state()
    mod.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    mod.nvtx = _Nvtx
    mod.is_initialized = lambda: True
    return mod


_DEVICE_MODULE = _cpu_device_module()


class PlatformCPU(PlatformBase):
    """verl on the CPU: gloo collectives, logical Ray GPUs, no device memory."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it (verl probes registered platforms in order).
        return False

    def current_device(self):  # "cpu", not an index: verl does .to(get_device_id())
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for logical GPUs; verl records it, nothing reads devices

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical: ray.init(num_gpus=N) on a machine without GPUs

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
