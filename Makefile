# Flywheel: `make demo` runs the main job, `make test` lint and the whole suite, `make bench` the benchmarks.
# Each target sets itself up first (virtualenv + Kafka and S3Proxy jars cached under $FLYWHEEL_HOME).
FLYWHEEL_HOME ?= $(HOME)/.cache/flywheel
export FLYWHEEL_HOME
VENV := $(FLYWHEEL_HOME)/venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)
PYTEST_ARGS ?=

.PHONY: setup lint test demo bench clean

setup:
	@scripts/setup.sh

# ruff's configuration is in pyproject.toml; `ruff format .` (from the venv) rewrites what --check rejects.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

DEMO_ARGS ?=
demo: setup
	$(PY) -m flywheel demo $(DEMO_ARGS)

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf demo_out .pytest_cache
