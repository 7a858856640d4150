"""The house's rules, read from the code's own imports (every ``import``, at the top or inside a function):

- the plugin's layers import downwards only: ``core`` (pure: samples, plans, policies, predictors) imports nothing
  of ours outside itself; ``predict`` only ``core``; ``engines`` only those two; ``drafter`` nothing of ours
  outside itself, and of it only ``drafter.vllm_adapter`` imports vLLM; ``integration`` (everything that touches
  verl) anything below it; ``cli`` anything of the plugin;
- no module imports the package it lives in from below (``from .. import x`` of a package's ``__init__``);
- the plugin never imports the lab (``infsample_lab``): ``pip install .`` ships it alone;
- no import cycle among the plugin's modules, nor among the lab's.
"""

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN, LAB = "verl_infsample", "infsample_lab"
SOURCES = {PLUGIN: ROOT / "verl_infsample", LAB: ROOT / "lab" / "infsample_lab"}
# each top-level part of the plugin, and what it may import of ours
LAYERS = {"report": 0, "core": 1, "predict": 2, "engines": 3, "drafter": 3, "integration": 4, "cli": 5}


def _module_name(package: str, path: Path, root: Path | None = None) -> str:
    parts = list(path.relative_to(root or SOURCES[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(package: str, root: Path | None = None, ours: bool = True) -> dict[str, set[str]]:
    """Every module of ``package`` (at ``root``) -> the modules of ours it imports (relative imports resolved;
    ``ours`` False: everyone's)."""
    graph: dict[str, set[str]] = {}
    root = root or SOURCES[package]
    for path in sorted(root.rglob("*.py")):
        name = _module_name(package, path, root)
        is_package = path.name == "__init__.py"
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[:len(base) - node.level + (1 if is_package else 0)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if node.module:  # (``from . import module`` imports the module, its package being loaded already)
                    found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}  # ``from pkg import module``
        graph[name] = {m for m in found if not ours or m.split(".")[0] in (PLUGIN, LAB)}
    return graph


def _known(graph: dict[str, set[str]], modules: set[str]) -> dict[str, set[str]]:
    """The graph restricted to real modules (``from x import name`` adds ``x.name``, a module only sometimes)."""
    return {m: {t for t in targets if t in modules and t != m} for m, targets in graph.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        for target in targets:
            if target.split(".")[0] == LAB:
                wrong.append(f"{module} imports the lab ({target})")
            elif target == PLUGIN and module != PLUGIN:
                wrong.append(f"{module} imports the package root")
            elif (_layer(target) or 0) > (_layer(module) if _layer(module) is not None else 99):
                wrong.append(f"{module} imports upwards ({target})")
    return sorted(wrong)


def test_the_plugin_imports_downwards_only_and_never_the_lab():
    wrong = _upward_imports(_imports(PLUGIN))
    assert not wrong, "\n".join(wrong)


def test_the_drafter_is_one_room_and_one_adapter_touches_vllm():
    graph = _imports(PLUGIN, ours=False)
    drafter = {m: targets for m, targets in graph.items() if m.startswith(f"{PLUGIN}.drafter")}
    assert f"{PLUGIN}.drafter.vllm_adapter" in drafter
    wrong = [f"{m} imports {t}" for m, targets in drafter.items() for t in targets
             if (t.startswith(PLUGIN + ".") and not t.startswith(f"{PLUGIN}.drafter"))
             or (t.split(".")[0] == "vllm" and m != f"{PLUGIN}.drafter.vllm_adapter")]
    assert not wrong, "\n".join(sorted(wrong))
    assert any(t.split(".")[0] == "vllm" for t in drafter[f"{PLUGIN}.drafter.vllm_adapter"])


def test_no_module_imports_its_own_package_from_below():
    wrong = []
    for package in SOURCES:
        graph = _imports(package)
        packages = {m for m in graph if (SOURCES[package] / Path(*m.split(".")[1:]) / "__init__.py").exists()}
        for module, targets in graph.items():
            for target in targets & packages:
                if module.startswith(target + ".") and target != package:
                    wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def _cycles(imports: dict[str, set[str]]) -> list[str]:
    graph = _known(imports, set(imports))
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


@pytest.mark.parametrize("package", sorted(SOURCES))
def test_no_import_cycle(package):
    cycles = _cycles(_imports(package))
    assert not cycles, "\n".join(cycles)


def test_the_rules_see_a_violation(tmp_path):
    """The checker itself, on a small tree: ``core`` importing ``integration`` (lazily), the lab imported by the
    plugin, and a two-module cycle are found; the same tree without them passes."""
    root = tmp_path / "verl_infsample"
    for folder in ("core", "integration"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "core" / "a.py").write_text("def f():\n    from ..integration import b\n")
    (root / "integration" / "b.py").write_text("from . import c\nimport infsample_lab.demo\n")
    (root / "integration" / "c.py").write_text("from .b import x\n")
    graph = _imports(PLUGIN, root)
    assert _upward_imports(graph) == ["verl_infsample.core.a imports upwards (verl_infsample.integration)",
                                      "verl_infsample.core.a imports upwards (verl_infsample.integration.b)",
                                      "verl_infsample.integration.b imports the lab (infsample_lab.demo)"]
    assert _cycles(graph) == ["verl_infsample.integration.b -> verl_infsample.integration.c -> "
                              "verl_infsample.integration.b"]
    (root / "core" / "a.py").write_text("import numpy\n")
    (root / "integration" / "b.py").write_text("from ..core import a\n")
    graph = _imports(PLUGIN, root)
    assert _upward_imports(graph) == [] and _cycles(graph) == []


def test_the_wheel_is_the_plugin_alone(tmp_path):
    """``pip install .`` gives the plugin: the wheel holds ``verl_infsample`` (and its router yaml), no lab module,
    no benchmark, replay or tiny model."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "src"  # a copy: setuptools leaves build/ beside what it builds
    shutil.copytree(ROOT / "verl_infsample", source / "verl_infsample",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("verl_infsample-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"verl_infsample", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "verl_infsample/integration/rollout/group_affinity_router.yaml" in names
    assert "verl_infsample/integration/rollout/vllm/server.py" in names
    lab_words = ("bench", "replay", "tiny", "demo", "tasks")
    assert not [n for n in names if any(w in n for w in lab_words)]
    # the patches ship inside it: installed from the wheel alone, the plugin finds and arms the CPU sampler fixes
    patches = sorted(p.name for p in (ROOT / "patches").glob("*.py"))
    assert all(f"verl_infsample/patches/{name}" in names for name in patches)
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    found = subprocess.run([sys.executable, "-c", "from verl_infsample.integration.cpu import PATCHES_DIR, "
                            "load_patches; print(PATCHES_DIR); print(*[p.TARGET for p in load_patches("
                            "'vllm_cpu_sampler_*.py')])"], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)})
    assert found.returncode == 0, found.stderr[-2000:]
    where, targets = found.stdout.strip().split("\n")
    assert where.startswith(str(target)) and "_expand_kernel_impl" in targets and "apply_top_k_only" in targets


def test_the_lab_finds_the_checkout_it_runs_from(monkeypatch):
    """The lab's demo and bench-verl run the checkout's example scripts, and its tiny models cache under the
    checkout's ``.cache/``, wherever the lab's own files sit."""
    from infsample_lab import demo
    from infsample_lab.bench import in_verl
    from infsample_lab.models import tiny_build
    from infsample_lab.paths import REPO

    assert REPO == ROOT
    assert demo.SCRIPT.is_file() and all(w.script.is_file() for w in in_verl.WORKLOADS.values())
    monkeypatch.delenv("INFSAMPLE_TINY_MODEL_CACHE", raising=False)
    assert tiny_build._default_cache_root() == ROOT / ".cache" / "tiny-model"
