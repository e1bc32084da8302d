# Flywheel: `make demo` runs the main job, `make test` lint and the whole suite, `make bench` the benchmarks.
# Each target sets itself up first (virtualenv + Kafka and S3Proxy jars cached under $FLYWHEEL_HOME).
FLYWHEEL_HOME ?= $(HOME)/.cache/flywheel
export FLYWHEEL_HOME
VENV := $(FLYWHEEL_HOME)/venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)
PYTEST_ARGS ?=

.PHONY: setup lint models test demo bench clean

setup:
	@scripts/setup.sh

# ruff's and mypy's configurations are in pyproject.toml; `ruff format .` (from the venv) rewrites what --check
# rejects. mypy's cache (a warm run: seconds) lives with the venv, outside the checkout.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --cache-dir $(FLYWHEEL_HOME)/mypy_cache

# The models the suite runs on, found in the cache or built before it starts: a cold build takes minutes (the
# agent model ~15 on 2 cores), longer than the timeout of the test whose fixture would otherwise build it.
models: setup
	$(PY) -m flywheel model bootstrap --preset test
	$(PY) -m flywheel model bootstrap --preset agent

test: lint models
	$(PY) -m pytest $(PYTEST_ARGS)

DEMO_ARGS ?=
demo: setup
	$(PY) -m flywheel demo $(DEMO_ARGS)

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf demo_out .pytest_cache
