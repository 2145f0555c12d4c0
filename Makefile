# The two commands a new machine needs: `make demo` (the main job on embedded local clusters) and
# `make test` (the suite).
# Each target installs what it needs first: system packages (scripts/bootstrap-system.sh) and a
# virtual environment in .venv with the project and its test/dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Delta Lake's jars, fetched from Maven Central by Maven (not by Spark's Ivy) into a folder make
# owns; Spark gets them as spark.jars through PGLOGREPL_DELTA_JARS.
JARS_DIR := .cache/jars
JARS_STAMP := $(JARS_DIR)/.fetched
export PGLOGREPL_DELTA_JARS ?= $(CURDIR)/$(JARS_DIR)

.PHONY: demo test test-unit lint system venv jars clean

demo: system venv jars
	$(PY) scripts/demo.py $(DEMO_ARGS)

test: system venv jars
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

system:
	./scripts/bootstrap-system.sh

venv: $(STAMP)

jars: $(JARS_STAMP)

$(JARS_STAMP): airflow_pglogrepl/spark/session.py | $(STAMP)
	./scripts/fetch-delta-jars.sh $(JARS_DIR) $$($(PY) -c 'from airflow_pglogrepl.spark.session import DELTA_PACKAGES; print(*DELTA_PACKAGES)')
	touch $(JARS_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --progress-bar off --upgrade pip
	$(PY) -m pip install --quiet --progress-bar off -e '.[test,dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
