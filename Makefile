# cascade: `make demo` (venv, install, a real recorded run of the example) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build for development and CI; the package itself accepts a range (see pyproject.toml).
TORCH_PIN ?= torch==2.13.0
# The package's bytecode, as `pip install` of a wheel leaves it: an editable install on a machine
# with PYTHONDONTWRITEBYTECODE set (this one) otherwise compiles every module on every start
# (~0.09 s of each `cascade` command). Stale files after an edit are recompiled as usual.
COMPILE = $(BIN)/python -m compileall -q cascade_repro
# The suite runs on this many pytest-xdist workers: one per core, at most 4 (each test starts real
# training and servers of its own). A test file stays on one worker (--dist loadfile): the Docker
# suite's session fixtures share its wheelhouse and remove its images at the end. (loadgroup
# would do it per group, but pytest-xdist 3.8 cannot rename pytest 9's node ids.)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
PYTEST = $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -v

.PHONY: install install-dev demo test test-fast lint bench clean

# The package and the example's data loader (what `make demo` needs); then the test and lint tools
# and the frameworks the suite trains with (lightning, transformers, accelerate, selenium).
install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e '.[examples]'
	$(COMPILE)
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: install
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo.sh

test: install-dev
	bash scripts/services.sh
	$(PYTEST)

test-fast: install-dev
	$(PYTEST) -m "not slow"

lint: install-dev
	$(BIN)/ruff check cascade_repro tests benchmarks
	$(BIN)/mypy cascade_repro

bench: install-dev
	$(COMPILE)
	PATH="$(abspath $(BIN)):$$PATH" bash benchmarks/run_all.sh

clean:
	rm -rf $(VENV) .demo .cascade mlflow.db mlruns .pytest_cache
