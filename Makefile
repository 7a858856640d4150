# verl-infsample: `make demo` and `make test` are the two entry points; both set up .venv/ first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
VERL_VERSION := 0.9.1

.PHONY: setup demo bench test clean-venv

setup: $(STAMP)

# Re-runs only when the requirements or the package metadata change: a second `make setup` takes seconds.
$(STAMP): requirements/cpu.txt pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/cpu.txt
	$(BIN)/python -m pip install -q --no-deps verl==$(VERL_VERSION)
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $(STAMP)

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
