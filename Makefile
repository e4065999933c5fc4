# Two entry points for a fresh machine with Python 3.11, pip and make: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-cluster lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stellaris demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The multi-node Ray cluster tests run in CI's cluster stage (`make test-cluster`, .ci/cluster-e2e.sh).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -n 2 -m "not cluster"

test-cluster: $(STAMP)
	$(BIN)/pytest -n 2 --dist loadfile -m cluster

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
