"""The README's GPU installs resolve for Linux x86_64 with CUDA wheels, as written: verl 0.9.1's own stack
(``.[gpu]``: vLLM 0.24.0) and vLLM 0.32 (``.[gpu-vllm-032]`` with uv's override). uv resolves them against the
package index (no install), so a pin that stops resolving fails here, not on a user's GPU machine."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
PLATFORM = ["--python-platform", "x86_64-manylinux_2_28"]


def _readme_command(prefix: str) -> list[str]:
    """The README's install line starting with ``prefix`` (comment dropped), split as a shell would."""
    lines = [ln.split("  #")[0].strip() for ln in README.splitlines() if ln.strip().startswith(prefix)]
    assert lines, f"README.md has no install line starting with {prefix!r}"
    return shlex.split(lines[0])


def _resolve(args: list[str], python: str, tmp_path) -> dict[str, str]:
    """``uv pip compile`` of the README's ``pip install`` arguments: {distribution: version} or the conflict."""
    extras = [a for a in args if a.startswith(".[")]
    (target,) = extras
    extra = target[2:-1]
    rest = args[args.index(target) + 1:]
    cmd = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "--extra", extra, "--python-version",
           python, *PLATFORM, "--no-header", "--no-annotate", "-o", str(tmp_path / "lock.txt"), *rest]
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    for attempt in range(2):  # one retry: the index, not the pins, can fail once
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        if out.returncode == 0 or "No solution" in out.stderr:
            break
    assert out.returncode == 0, f"{' '.join(args)} does not resolve for Python {python}:\n{out.stderr[-3000:]}"
    pins = {}
    for line in (tmp_path / "lock.txt").read_text().split("\n"):
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


@pytest.mark.parametrize("python", ["3.10", "3.12"])
def test_the_gpu_install_is_verls_own_stack(python, tmp_path):
    args = _readme_command('pip install ".[gpu]"')
    assert args[:2] == ["pip", "install"]
    pins = _resolve(args[2:], python, tmp_path)
    assert pins["verl"] == "0.9.1" and pins["vllm"] == "0.24.0"
    assert pins["torch"] == "2.11.0" and pins["transformers"] == "5.9.0"
    assert "transferqueue" in pins  # verl's main_ppo imports it


def test_the_vllm_032_install_resolves_with_its_override(tmp_path):
    args = _readme_command('uv pip install ".[gpu-vllm-032]"')
    assert "--override" in args and (REPO / args[args.index("--override") + 1]).is_file()
    pins = _resolve(args[3:], "3.12", tmp_path)
    assert pins["verl"] == "0.9.1" and pins["vllm"] == "0.32.0" and pins["transformers"].startswith("5.19")
    assert "transferqueue" in pins


def test_without_the_override_vllm_032_and_verl_conflict(tmp_path):
    """What the override is for: were the pins to agree one day, this fails and the README can drop it."""
    args = _readme_command('uv pip install ".[gpu-vllm-032]"')
    bare = args[3:args.index("--override")]
    cmd = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "--extra", bare[0][2:-1],
           "--python-version", "3.12", *PLATFORM, "-o", str(tmp_path / "lock.txt")]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
    assert out.returncode != 0 and "transformers" in out.stderr
