# Cosched: `make demo` runs the embedded default, `make test` runs the whole test suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

# Tests talk to the real PostgreSQL and Redis on this machine.
TEST_ENV := DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	TEST_REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}

.PHONY: install demo test lint bench migrate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

demo: migrate
	$(BIN)/python manage.py load_demo
	$(BIN)/python manage.py runserver 127.0.0.1:8000

lint: install
	$(BIN)/ruff check .

test: install lint
	$(TEST_ENV) $(BIN)/pytest $(PYTEST_ARGS)

bench: install
	$(TEST_ENV) $(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache .ruff_cache
