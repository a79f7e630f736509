# Two set-up commands (see README): `make demo` and `make test`. Each creates the
# virtual environment if needed, installs everything pinned in pyproject.toml, then runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast install lint clickhouse-server chromium

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,torch,lightning,hf]'

demo: install
	$(BIN)/failslow demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy failslow

# Debian's ClickHouse server (18.16) is too old for the schema but speaks the native
# protocol; the transport tests use it when it can be installed and skip, saying so, if not.
clickhouse-server:
	@command -v clickhouse-server >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clickhouse-server >/dev/null; } || \
	  echo "clickhouse-server not installable here: its native-protocol tests will skip"

# Chromium renders `failslow report` pages headless in tests/test_report.py (skipped, saying
# so, when it cannot be installed).
chromium:
	@command -v chromium >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installable here: the report's browser tests will skip"

# Three pytest workers (pytest-xdist), a test file each at a time (--dist loadfile: a
# module's expensive fixtures are built once): most tests wait on a broker, a database
# or a torch job rather than compute, so 3 workers fit the 2-core VM (docs/benchmarks.md).
test: install lint clickhouse-server chromium
	$(BIN)/pytest -q -p no:cacheprovider --timeout=300 -n 3 --dist loadfile tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests ran: failing"; exit 1; fi; exit $$rc

# The inner loop: every test that starts no broker, no database and no multi-process
# torch job (those are marked `integration`; tests/conftest.py marks any test using the
# broker or database fixtures).
test-fast: install
	$(BIN)/pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not integration" tests
