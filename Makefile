# Every target creates .venv and installs what it needs, so a fresh clone
# with only Python 3.11 and Java 17 can run `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Spark's Python workers must use the interpreter that has our packages.
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: venv demo test test-fast bench lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m spark_integration.demo

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m 'not slow'

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

lint: $(STAMP)
	$(PY) -m ruff check sessionstore spark_integration tests bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-output demo-state bench-output
