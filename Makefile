# pykraft: every target bootstraps .venv itself, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: test unit integration demo bench bench-scale venv system-deps jvm-archive clean \
        lint format typecheck layers check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $@

venv: $(STAMP)

# The audit's Spark driver maps its classes from an archive (~3 s off every Spark start); a
# no-op when this JDK + pyspark already has one. Optional: the audit works without it.
jvm-archive: $(STAMP)
	-@$(PY) -m tools.audit.classdata

# kcat is a real Kafka client the tests drive; Debian ships it.
system-deps:
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "installing kcat (Debian package)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat) >/dev/null \
	  || echo "warning: could not install kcat; kcat tests will be skipped"; }

# Two workers, one test module each (modules share their clusters): the integration tests
# mostly wait on processes, so two of them fit on two cores.
test: $(STAMP) system-deps jvm-archive
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=30 tests

# tests/unit is pure (no sockets, no processes: tests/unit/conftest.py refuses them).
unit: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 tests/unit

integration: $(STAMP) system-deps jvm-archive
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests/integration tests/spark

# The engineering gates CI runs before the tests.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# kraft imports nothing from broker or tools; broker nothing from tools (import-linter).
layers: $(STAMP)
	$(VENV)/bin/lint-imports

check: lint typecheck layers

demo: $(STAMP) jvm-archive
	$(PY) -m tools.demo

bench: $(STAMP) jvm-archive
	$(PY) -m bench.run_all

bench-scale: $(STAMP)
	$(PY) -m bench.run_all --scale

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
