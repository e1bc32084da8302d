# Flywheel: `make demo` runs the main job, `make test` lint and the whole suite, `make bench` the benchmarks,
# `make docs` the manual (docs/, mkdocs.yml) into site/.
# Each target sets itself up first (virtualenv + Kafka and S3Proxy jars cached under $FLYWHEEL_HOME).
FLYWHEEL_HOME ?= $(HOME)/.cache/flywheel
export FLYWHEEL_HOME
VENV := $(FLYWHEEL_HOME)/venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)
PYTEST_ARGS ?=

.PHONY: setup lint models test demo bench docs clean

setup:
	@scripts/setup.sh

# mkdocs-material 9.8 prints on every build that it reaches end of life on 2027-05-05 (fixes until then; Zensical,
# its successor, reads the same mkdocs.yml). Silenced here; the build's own warnings still show, and fail it.
export NO_MKDOCS_2_WARNING := 1

# ruff's and mypy's configurations are in pyproject.toml; `ruff format .` (from the venv) rewrites what --check
# rejects. mypy's cache (a warm run: seconds) lives with the venv, outside the checkout.
# The manual is built too, strict (mkdocs.yml: a broken link or anchor, or a page not in the nav, fails), into a
# directory thrown away after (not --quiet: it hides the warnings that --strict counts, and passes).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --cache-dir $(FLYWHEEL_HOME)/mypy_cache
	@out=$$(mktemp -d) && $(PY) -m mkdocs build --strict --site-dir "$$out"; rc=$$?; rm -rf "$$out"; exit $$rc

# The models the suite runs on, found in the cache or built before it starts: a cold build takes minutes (the
# agent model ~15 on 2 cores), longer than the timeout of the test whose fixture would otherwise build it.
models: setup
	$(PY) -m flywheel model bootstrap --preset test
	$(PY) -m flywheel model bootstrap --preset agent

# Two phases (tests/README.md): what is safe beside another test on TEST_WORKERS pytest-xdist workers, then the
# tests marked `serial` alone. Both run; the target fails if either failed. A phase that PYTEST_ARGS leaves without
# a test exits 5, which is fine unless both do.
TEST_WORKERS ?= 2
test: lint models
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS); parallel=$$?; \
	$(PY) -m pytest -m serial $(PYTEST_ARGS); serial=$$?; \
	case "$$parallel $$serial" in "0 0"|"0 5"|"5 0") ;; *) exit 1;; esac

DEMO_ARGS ?=
demo: setup
	$(PY) -m flywheel demo $(DEMO_ARGS)

bench: setup
	$(PY) -m benchmarks

# The manual into site/ (open site/index.html); its figures are rendered from benchmarks/results/ as it builds.
docs: setup
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf demo_out .pytest_cache site
