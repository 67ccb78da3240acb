# `make demo` and `make test` each create .venv on first use and install into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch is what the demo and the tests need; override for another build,
# e.g. `make demo TORCH=torch` for the registry's default (CUDA) wheel.
TORCH ?= torch==2.13.0
DEMO_DIR ?= outputs/demo

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install "$(TORCH)"
	$(BIN)/pip install -e .
	$(BIN)/python -c "from trajectory_transformer.model import native; native.main()"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/tt-train hydra.run.dir=$(DEMO_DIR)
	$(BIN)/tt-eval checkpoint=$(DEMO_DIR)/checkpoint.pt hydra.run.dir=$(DEMO_DIR)/eval

test: $(VENV)/.installed-test
	$(BIN)/ruff check trajectory_transformer tests scripts notebooks
	$(BIN)/python -m pytest -q

lint: $(VENV)/.installed-test
	$(BIN)/ruff check trajectory_transformer tests scripts notebooks
	$(BIN)/ruff format --check trajectory_transformer tests scripts notebooks

bench: $(VENV)/.installed
	$(BIN)/python scripts/bench_train.py

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .ruff_cache
