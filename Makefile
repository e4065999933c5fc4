# Two entry points for a fresh machine with Python 3.11, pip and make: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-long lint clean

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

# `make test` stays under 10 minutes on 2 cores; the learning tests and fault/resume runs over 40 s (`slow`) and the Ray cluster tests (`cluster`)
# run in `make test-long` (CI's long stage, .ci/long-stage.sh): the learning tests first (a learning test beside a Ray
# cluster's start-up loses its pace on 2 cores), then the cluster tests, each module on one worker (one Ray cluster each).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/pytest -n 2 -m "not cluster and not slow"

test-long: $(STAMP)
	$(BIN)/pytest -n 2 -m "slow and not cluster"
	$(BIN)/pytest -n 2 --dist loadfile -m cluster

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
