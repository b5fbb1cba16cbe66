# agentops: `make demo` runs a release agent end to end on SQLite and the filesystem broker;
# `make test` runs the suite against PostgreSQL and Redis on 127.0.0.1.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/agentops
TEST_BROKER_URL ?= redis://127.0.0.1:6379/0

.PHONY: install demo test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python manage.py migrate --verbosity 0
	$(BIN)/python manage.py demo

test: $(STAMP)
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) $(BIN)/pytest

clean:
	rm -rf var .pytest_cache
