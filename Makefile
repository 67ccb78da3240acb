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
# pytest-xdist's workers for `make test`: one per core (`make test TEST_WORKERS=0`: in-process).
TEST_WORKERS ?= auto
PIP_INSTALL = $(BIN)/pip install -c $(CONSTRAINTS)
# Resolves pyproject.toml's ranges for every platform and Python version it allows, preferring
# one version of each package for all of them.
LOCK = $(BIN)/uv pip compile pyproject.toml --all-extras --universal --fork-strategy fewest \
	--constraint $(VENV)/torch-pin.txt --no-emit-package torch \
	--custom-compile-command "make lock" --quiet --output-file $(CONSTRAINTS)

.PHONY: demo test test-oldest lint bench lock upgrade clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) "$(TORCH)"
	$(PIP_INSTALL) -e .
	$(BIN)/python -c "from trajectory_transformer.model.decode import native; native.main()"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP_INSTALL) -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/tt-train hydra.run.dir=$(DEMO_DIR)
	$(BIN)/tt-eval checkpoint=$(DEMO_DIR) hydra.run.dir=$(DEMO_DIR)/eval

test: $(VENV)/.installed-test
	$(BIN)/ruff check trajectory_transformer tests scripts notebooks
	$(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors: a broken link or
# anchor, or a page missing from the nav, fails. The build first writes the configuration
# reference, docs/reference/configuration.md, from the code (scripts/config_reference.py).
.PHONY: docs
docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict --site-dir site

# The lowest versions that pyproject.toml allows, every direct dependency at its floor (uv's
# lowest-direct resolution; torch's floor is a CUDA build on Linux, a few GB), in a venv of
# their own: the floors are only true if the tests pass there. OLDEST_TESTS are those that meet
# the dependencies' APIs (tensors and checkpoints, torch.compile, gymnasium's vector envs,
# Minari, Hydra, AdaStop), a few minutes; `make test-oldest OLDEST_TESTS=tests` runs them all.
OLDEST_VENV ?= .venv-oldest
OLDEST_TESTS ?= tests/test_imports.py tests/data tests/test_checkpoint.py \
	tests/planning/test_episode_boundaries.py tests/planning/test_static_decode.py \
	tests/evaluation/test_envs.py tests/training/test_schedule.py \
	tests/comparison/test_statistics.py \
	tests/cli/test_train_cli.py::test_resume_with_another_model_shape_says_what_differs \
	"tests/cli/test_eval_cli.py::test_eval_end_to_end_writes_results_next_to_the_checkpoint[cpu]"

$(OLDEST_VENV)/.installed: pyproject.toml
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet uv
	$(OLDEST_VENV)/bin/uv pip install --quiet --python $(OLDEST_VENV)/bin/python \
		--resolution lowest-direct -e ".[test]"
	$(OLDEST_VENV)/bin/python -c "from trajectory_transformer.model.decode import native; native.main()"
	touch $@

test-oldest: $(OLDEST_VENV)/.installed
	$(OLDEST_VENV)/bin/uv pip list --python $(OLDEST_VENV)/bin/python 2>/dev/null \
		| grep -iE '^(torch|numpy|gymnasium|minari|hydra-core|matplotlib|wandb|triton) '
	$(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider $(OLDEST_TESTS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check trajectory_transformer tests scripts notebooks
	$(BIN)/ruff format --check trajectory_transformer tests scripts notebooks

# Every pretrained checkpoint (pretrained/manifest.json) evaluated again, with the planner and
# with BC, each score compared with its manifest's; the table of what it measured is the record
# pretrained/scores, written into the pages (scripts/pretrained.py check). RESUME=1 continues
# an interrupted one, keeping the episodes it had finished.
.PHONY: results
results: $(VENV)/.installed
	$(BIN)/python scripts/pretrained.py check $(if $(RESUME),--resume)
	$(BIN)/python scripts/render_results.py

# Every results table of the README and docs/ written from its record, docs/results/records/
# (scripts/render_results.py; `--check` only compares).
.PHONY: results-tables
results-tables: | $(BIN)/python
	$(BIN)/python scripts/render_results.py

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
	rm -rf $(VENV) $(OLDEST_VENV) outputs multirun .pytest_cache .ruff_cache
