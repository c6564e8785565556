# Every target creates a virtualenv and installs what it needs, so a fresh clone
# with only Python (3.11, 3.12 or 3.13) and Java 17 can run `make demo` and `make test`.
# PYTHON picks the interpreter; 3.11 uses .venv, any other version its own
# .venv-X.Y (`PYTHON=python3.12 make test-fast` creates .venv-3.12).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV ?= $(if $(filter 3.11,$(PYTHON_VERSION)),.venv,.venv-$(PYTHON_VERSION))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Spark's Python workers must use the interpreter that has our packages.
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: venv demo test test-fast dist cluster-test bench bench-cluster lint clean

venv: $(STAMP)

# The install runs with --no-compile: pip would byte-compile every module of every
# package (PySpark's, pandas' and their tests), about 50 s of CPU; a module is
# compiled, once, when something first imports it (a fresh .venv-3.13 and its fast
# suite: 3 min 16 s instead of 4 min 9 s, the suite itself no slower).
$(STAMP): pyproject.toml
	@test -n "$(PYTHON_VERSION)" || { echo "PYTHON=$(PYTHON) does not run: set PYTHON to a Python 3.11-3.13 interpreter" >&2; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m spark_integration.dev.demo

# The suite runs in TEST_WORKERS pytest-xdist processes, a test file each at a time
# (`--dist loadfile`: a module's fixtures, a started stream among them, stay in one
# process). Most of a Spark test's time is spent waiting (on a trigger, a task's
# Python worker, a server's start), so more processes than cores keep both busy;
# TEST_WORKERS=0 runs it in this process. Modules go out longest first, in the
# conftest's order (tests/schedule.py), not pytest-xdist's by number of tests; with
# 3 workers or more, one never starts a Spark session (the others take the modules
# that use one: tests/schedule.py says why).
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m 'not slow'

# An sdist and a wheel in dist/ (the wheel holds the two packages, the
# `sessionstore` console script and their metadata; tests/test_dist.py checks it).
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .

# A Spark standalone cluster (a master, two workers) on 127.0.0.1 runs the demo's
# job from the wheel, shipped as a packed virtualenv; stops everything it started.
cluster-test: dist
	$(PY) -m tests.standalone.check --wheel dist/*.whl

bench: $(STAMP)
	$(PY) bench/stores.py
	$(PY) bench/operators.py
	$(PY) bench/restore.py
	$(PY) bench/handover.py
	$(PY) bench/python_tasks.py
	$(PY) bench/spark_sessionize.py --floor-parts
	$(PY) bench/spark_scale.py
	$(PY) bench/processors.py
	$(PY) bench/processors.py --events 1200000 --apis rows
	$(PY) bench/dump.py

# The demo's job on a standalone cluster against the same job in local[2].
bench-cluster: dist
	$(PY) bench/cluster.py --wheel dist/*.whl

lint: $(STAMP)
	$(PY) -m ruff check sessionstore spark_integration tests bench

clean:
	rm -rf .venv .venv-3.* .pytest_cache .hypothesis demo-output demo-state bench-output build dist
