# The two commands a new machine needs: `make demo` (the main job on embedded local clusters) and
# `make test` (the suite).
# Each target installs what it needs first: system packages (scripts/bootstrap-system.sh) and a
# virtual environment in .venv with the project and its test/dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-unit lint system venv clean

demo: system venv
	$(PY) scripts/demo.py $(DEMO_ARGS)

test: system venv
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

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --progress-bar off --upgrade pip
	$(PY) -m pip install --quiet --progress-bar off -e '.[test,dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
