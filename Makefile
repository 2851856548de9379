# Cosched: `make demo` runs the embedded default, `make test` runs the whole test suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# Where `make demo` serves the portal: `make demo PORT=8001` if 8000 is taken.
HOST ?= 127.0.0.1
PORT ?= 8000

# Tests talk to the real PostgreSQL and Redis on this machine.
TEST_ENV := DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	TEST_REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}

# Browser tests drive Debian's headless Chromium through its chromedriver.
BROWSER_PACKAGES := chromium chromium-driver

.PHONY: install demo test lint bench bench-quick browser-deps migrate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

# The embedded default: SQLite under var/, Celery tasks in-process, demo data, and one process
# serving the portal, running the scheduling loop and the virtual nodes' agents.
# DEMO_SCALE shortens the demo jobs (profile times x DEMO_SCALE): 0.2 runs seed 004 in ~5 min.
DEMO_SCALE ?= 0.2
demo: migrate
	$(BIN)/python manage.py load_demo --emulate-scale $(DEMO_SCALE)
	$(BIN)/python manage.py run_embedded $(HOST):$(PORT)

lint: install
	$(BIN)/ruff check .

# Installs Chromium and chromedriver with apt-get when they are missing (as root, or through
# passwordless sudo). Without either it says what to run and carries on: the browser tests then
# skip with the same advice.
browser-deps:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
		echo "browser-deps: chromium and chromedriver present"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "browser-deps: no apt-get here; install Chromium and chromedriver yourself" \
			"(the browser tests skip without them)"; \
	else \
		if [ "$$(id -u)" = 0 ]; then SUDO=; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
		else \
			echo "browser-deps: chromium/chromedriver missing and not root (no passwordless sudo);"; \
			echo "  run: sudo apt-get install -y $(BROWSER_PACKAGES)"; \
			echo "  (the browser tests skip until then)"; \
			exit 0; \
		fi; \
		echo "browser-deps: installing $(BROWSER_PACKAGES) with apt-get"; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			--no-install-recommends $(BROWSER_PACKAGES); \
	fi

test: install lint browser-deps
	$(TEST_ENV) $(BIN)/pytest $(PYTEST_ARGS)

bench: install
	$(TEST_ENV) $(BIN)/python -m benchmarks $(BENCH_ARGS)

bench-quick: install
	$(TEST_ENV) $(BIN)/python -m benchmarks --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache .ruff_cache
