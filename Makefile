# `make demo` and `make test` each create .venv on first use and install into it, taking every
# dependency at the version recorded in constraints.txt (a tested set; `make upgrade` renews it).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints.txt
# torch is pinned here rather than in constraints.txt: its wheels are large and come in builds
# (CPU, CUDA) that a machine chooses. To move to another release, change this line and run
# `make upgrade`, which resolves the other dependencies against it.
TORCH ?= torch==2.13.0
DEMO_DIR ?= outputs/demo
PIP_INSTALL = $(BIN)/pip install -c $(CONSTRAINTS)
# Resolves pyproject.toml's ranges for every platform and Python version it allows, preferring
# one version of each package for all of them.
LOCK = $(BIN)/uv pip compile pyproject.toml --all-extras --universal --fork-strategy fewest \
	--constraint $(VENV)/torch-pin.txt --no-emit-package torch \
	--custom-compile-command "make lock" --quiet --output-file $(CONSTRAINTS)

.PHONY: demo test lint bench lock upgrade clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) "$(TORCH)"
	$(PIP_INSTALL) -e .
	$(BIN)/python -c "from trajectory_transformer.model import native; native.main()"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP_INSTALL) -e ".[test]"
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

# After editing pyproject.toml: resolve again, keeping the recorded versions that still fit.
lock: | $(BIN)/python
	$(BIN)/pip install --quiet uv
	echo "$(TORCH)" > $(VENV)/torch-pin.txt
	$(LOCK)

# The newest versions pyproject.toml allows: record them, reinstall from scratch, run the tests.
upgrade: | $(BIN)/python
	$(BIN)/pip install --quiet uv
	echo "$(TORCH)" > $(VENV)/torch-pin.txt
	$(LOCK) --upgrade
	rm -rf $(VENV)
	$(MAKE) test
	-git diff --stat -- $(CONSTRAINTS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .ruff_cache
