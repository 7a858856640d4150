"""The CPU mode: a "cpu" platform through verl's platform plugin API plus four patches, all opt-in.

* without the opt-in, nothing of it happens (no platform, no patch, no engine registration), and a selection of
  verl's own CPU tests passes with the plugin installed;
* with ``VERL_INFSAMPLE_CPU=1`` verl's device layer answers "cpu"/"gloo", the patches are in, a gloo process group
  comes up through verl's own function, and verl's FSDP engine is found for device "cpu";
* the code the patches replace or depend on is still verl 0.9.1's (a verl upgrade that moves it fails here).

Each check runs in a fresh interpreter: the opt-in is read when ``import verl`` loads the plugin.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

VERL_TESTS = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" \
    / "tests"
# verl's own CPU tests that need neither Ray nor a GPU (about 20 s together on 2 cores)
VERL_CPU_TESTS = [
    "plugin/test_platform_abstraction.py",
    "test_protocol_on_cpu.py",
    "test_base_config_on_cpu.py",
    "trainer/ppo/test_core_algos_on_cpu.py",
    "trainer/ppo/test_metric_utils_on_cpu.py",
    "trainer/test_multi_trajectories_advantage_on_cpu.py",
]
OPT_IN_VARS = ("VERL_INFSAMPLE_CPU", "VERL_PLATFORM", "VERL_ENGINE_DEVICE")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in OPT_IN_VARS}
    env.pop("VERL_USE_EXTERNAL_PLUGINS", None)  # the plugin must load through its entry point
    env.update(extra)
    return env


def _run(code: str, **env) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object on its last stdout line."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=_env(**env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


PROBE = """
    import json, sys
    import verl
    import verl.utils.distributed as dist_utils
    import verl.workers.engine_workers as engine_workers
    import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.rollout.base import get_rollout_class
    print(json.dumps({
        "plugin_loaded": "verl_infsample.integration.plugin" in sys.modules and get_rollout_class("infinite").__name__,
        "cpu_registered": "cpu" in PlatformRegistry.registered_names(),
        "pg_patched": getattr(dist_utils.initialize_global_process_group_ray, "_infsample_cpu", False),
        "pg_patched_in_workers": getattr(engine_workers.initialize_global_process_group_ray, "_infsample_cpu", False),
        "offload_patched": getattr(fsdp_impl.CPUOffloadPolicy, "_infsample_cpu", False),
        "cpu_engine": any("cpu" in by_device for by_backend in EngineRegistry._engines.values()
                          for by_device in by_backend.values()),
    }))
"""


def test_without_opt_in_nothing_changes():
    out = _run(PROBE)
    assert out == {"plugin_loaded": "make_rollout_adapter", "cpu_registered": False, "pg_patched": False,
                   "pg_patched_in_workers": False, "offload_patched": False, "cpu_engine": False}


def test_opt_in_registers_platform_patches_and_engine():
    out = _run(PROBE, VERL_INFSAMPLE_CPU="1")  # VERL_PLATFORM=cpu opts in too: test_opted_in_reads_both_switches
    assert out == {"plugin_loaded": "make_rollout_adapter", "cpu_registered": True, "pg_patched": True,
                   "pg_patched_in_workers": True, "offload_patched": True, "cpu_engine": True}


def test_cpu_platform_runs_verls_device_layer_and_a_gloo_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _run("""
        import json, torch, torch.distributed as dist
        import verl
        from verl.utils import device
        from verl.utils.distributed import initialize_global_process_group_ray
        from verl.workers.engine.base import EngineRegistry
        from verl.workers.engine.fsdp import transformer_impl
        initialize_global_process_group_ray(timeout_second=60)   # verl's own call, default backend
        t = torch.ones(3).to(device.get_device_id())
        dist.all_reduce(t)
        policy = transformer_impl.CPUOffloadPolicy(pin_memory=True)
        tdev = device.get_torch_device()
        print(json.dumps({
            "device": device.get_device_name(), "backend": device.get_nccl_backend(),
            "device_id": str(device.get_device_id()), "resource": device.get_resource_name(),
            "dist_backend": str(dist.get_backend()), "sum": t.tolist(), "tensor_device": str(t.device),
            "pin_memory": policy.pin_memory, "policy": type(policy).__name__,
            "mem": [tdev.memory_allocated(), tdev.max_memory_reserved(), tdev.empty_cache()],
            "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
        }))
        dist.destroy_process_group()
    """, VERL_INFSAMPLE_CPU="1", RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert out == {"device": "cpu", "backend": "gloo", "device_id": "cpu", "resource": "GPU",
                   "dist_backend": "cpu:gloo", "sum": [1.0, 1.0, 1.0], "tensor_device": "cpu", "pin_memory": False, "policy": "CPUOffloadPolicy",
                   "mem": [0, 0, None], "engine": "FSDPEngineWithLMHead"}


def test_patch_targets_are_verl_0_9_1s():
    """Each patch names the verl code it changes and its sha256; a verl upgrade that changes that code fails here:
    re-read the patch against the new code, then update SOURCE_SHA256."""
    from verl_infsample.integration.cpu import load_patches, resolve, source_sha256

    patches = load_patches()
    assert sorted(Path(p.__file__).name for p in patches) == ["verl_cpu_fsdp2_offload.py",
                                                               "verl_cpu_process_group.py",
                                                               "verl_cpu_weight_sync_receiver.py",
                                                               "verl_cpu_weight_sync_sender.py"]
    for patch in patches:
        assert patch.__doc__ and "What:" in patch.__doc__ and "Why a patch:" in patch.__doc__, patch.__file__
        module, target = resolve(patch.TARGET)
        assert source_sha256(target) == patch.SOURCE_SHA256, f"{patch.TARGET} changed ({patch.__file__})"
    import verl.utils.distributed as dist_utils
    import verl.workers.engine.fsdp.transformer_impl as fsdp_impl

    # what the patches rely on besides the hashed code: the names they rebind, and who calls them
    assert "initialize_global_process_group_ray(timeout_second=None)" in Path(
        __import__("verl.workers.engine_workers", fromlist=["x"]).__file__).read_text()
    assert 'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in source_of(
        dist_utils.initialize_global_process_group_ray)
    assert "CPUOffloadPolicy(pin_memory=True)" in source_of(fsdp_impl.FSDPEngine._build_fsdp_module)
    assert fsdp_impl.CPUOffloadPolicy.__module__.startswith("torch.distributed")


SOCKET_PROBE = """
    import json, types
    import verl.workers.rollout.vllm_rollout.utils as vllm_utils
    import verl.workers.rollout.vllm_rollout.vllm_rollout as vllm_rollout

    worker = types.SimpleNamespace(local_rank=0, model_runner=None)
    print(json.dumps({
        "sender_patched": getattr(vllm_rollout.ServerAdapter.__init__, "_infsample_cpu", False),
        "receiver": vllm_utils.vLLMColocateWorkerExtension._get_zmq_handle(worker),
    }))
"""


def test_two_ray_clusters_on_one_host_sync_weights_through_different_sockets():
    """verl names its weight-sync socket by Ray job id, ``01000000`` for the first job of every fresh cluster; two
    runs at once on one host then share it and hang. With the opt-in both ends put the raylet's pid in the name: the
    vLLM end differs between clusters and still equals what the trainer end binds (verl's own f-string, scoped)."""
    from verl_infsample.integration.cpu.weight_sync_socket import scoped_to_raylet
    import verl.workers.rollout.vllm_rollout.vllm_rollout as vllm_rollout

    ray_env = {"VERL_RAY_JOB_ID": "01000000", "VERL_REPLICA_RANK": "0"}
    first = _run(SOCKET_PROBE, VERL_INFSAMPLE_CPU="1", RAY_RAYLET_PID="4242", **ray_env)
    second = _run(SOCKET_PROBE, VERL_INFSAMPLE_CPU="1", RAY_RAYLET_PID="4243", **ray_env)
    plain = _run(SOCKET_PROBE, RAY_RAYLET_PID="4242", **ray_env)
    assert first["sender_patched"] and not plain["sender_patched"]
    assert first["receiver"] != second["receiver"]
    assert plain["receiver"] == "ipc:///tmp/rl-colocate-zmq-01000000-replica-0-rank-0.sock"
    # the trainer end: verl's own name, as ServerAdapter.__init__ builds it, with the same raylet's pid
    assert 'self.zmq_handle = f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-{self.replica_rank}-rank-{local_rank}.sock"' \
        in source_of(vllm_rollout.ServerAdapter.__init__)
    assert scoped_to_raylet(plain["receiver"], {"RAY_RAYLET_PID": "4242"}) == first["receiver"]


def source_of(fn) -> str:
    import inspect

    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return inspect.getsource(fn)


def test_opted_in_reads_both_switches():
    from verl_infsample.integration.cpu import opted_in

    assert not opted_in({})
    assert not opted_in({"VERL_INFSAMPLE_CPU": "0", "VERL_PLATFORM": "nvidia"})
    assert opted_in({"VERL_INFSAMPLE_CPU": "1"})
    assert opted_in({"VERL_PLATFORM": "CPU"})


@pytest.mark.skipif(not VERL_TESTS.is_dir(), reason="verl's wheel did not install its tests/ package")
@pytest.mark.timeout(600)
def test_verls_own_cpu_tests_pass_with_the_plugin_installed(tmp_path):
    files = [str(VERL_TESTS / f) for f in VERL_CPU_TESTS if (VERL_TESTS / f).is_file()]
    assert len(files) >= 4, f"verl's tests moved: {VERL_TESTS}"
    probe = tmp_path / "test_plugin_is_loaded.py"  # runs in the same process: the plugin was there
    probe.write_text("import sys, verl\n\ndef test_loaded():\n    assert 'verl_infsample.integration.plugin' in sys.modules\n"
                     "    from verl.plugin.platform import PlatformRegistry\n"
                     "    assert 'cpu' not in PlatformRegistry.registered_names()\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(probe), *files],
                          capture_output=True, text=True, cwd=tmp_path, timeout=560, env=_env())
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
