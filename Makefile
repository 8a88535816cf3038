# Two commands do all setup: `make demo` and `make test` (each creates .venv when missing).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The CPU build of torch 2.13.0 lies on disk on this project's machines; point pip at it
# explicitly so an unpinned index never hands out a multi-GB CUDA build instead.
WHEELS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

# Test processes (pytest-xdist; one test file per process at a time, so a file's tests share their
# compiled graphs): 2 keeps the 2-core CI machine busy while multi-process tests wait on peers.
TEST_WORKERS ?= 2

.PHONY: demo test test-slow lint bench docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(WHEELS) -e '.[test]'
	$(BIN)/python -m torch_neuronx.device.native --optional
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/ruff check torch_neuronx tests bench examples
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -m "not slow" -q -n $(TEST_WORKERS) --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q -n $(TEST_WORKERS) --dist loadfile

bench: $(STAMP)
	$(BIN)/python bench/compile.py

docs: $(STAMP)
	$(BIN)/python -m torch_neuronx.config --markdown > docs/environment.md
	$(BIN)/python -m torch_neuronx.observe --markdown > docs/metrics.md

clean:
	rm -rf $(VENV) build *.egg-info
