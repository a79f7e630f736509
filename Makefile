# Two set-up commands (see README): `make demo` and `make test`. Each creates the
# virtual environment if needed, installs everything pinned in pyproject.toml, then runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,torch]'

demo: install
	$(BIN)/failslow demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy schema models failslow/config.py

test: install lint
	$(BIN)/pytest -q -p no:cacheprovider --timeout=300 tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests ran: failing"; exit 1; fi; exit $$rc
