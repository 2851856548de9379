# Cosched: `make demo` runs the embedded default, `make test` runs the whole test suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha1sum | cut -c1-12)
# The pinned dependency set: pip takes every version from it (constraints), so a new release
# upstream cannot change what CI installs. `make lock` regenerates it after pyproject changes.
LOCK := requirements.lock
# Where `make demo` serves the portal: `make demo PORT=8001` if 8000 is taken.
HOST ?= 127.0.0.1
PORT ?= 8000

# Tests talk to the real PostgreSQL and Redis on this machine.
TEST_ENV := DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	TEST_REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}

# Browser tests drive Debian's headless Chromium through its chromedriver.
BROWSER_PACKAGES := chromium chromium-driver
# Container jobs (docs/containers.md) run with Podman and runc; the tests build their image from
# a static busybox (nothing is pulled).
CONTAINER_PACKAGES := podman runc busybox-static

.PHONY: install demo test test-slow lint bench bench-quick browser-deps container-deps migrate clean \
	lock docs chaos gpu-check gpu-check-dry

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(LOCK) -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# The docs site (docs/ + mkdocs.yml): the API reference and the policy parameters are generated
# from the code first; --strict makes a broken link or a page missing from the nav fail the build.
# The portal serves the result at /docs/.
DOCS_SITE := var/docs-site
docs: $(STAMP)
	$(BIN)/python -m portal.docs_build docs/reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d $(DOCS_SITE)

install: $(STAMP) docs

migrate: install
	$(BIN)/python manage.py migrate --noinput

# The embedded default: SQLite under var/, Celery tasks in-process, demo data, and one process
# serving the portal, running the scheduling loop and the virtual nodes' agents.
# DEMO_SCALE shortens the demo jobs (profile times x DEMO_SCALE): 0.2 runs seed 004 in ~5 min.
DEMO_SCALE ?= 0.2
# DEMO_ARRIVALS: demo jobs arriving per minute after the first 25, so the dashboard keeps moving
# (0 turns the stream off).
DEMO_ARRIVALS ?= 12
demo: migrate
	$(BIN)/python manage.py load_demo --emulate-scale $(DEMO_SCALE)
	$(BIN)/python manage.py run_embedded $(HOST):$(PORT) \
		--arrivals-per-minute $(DEMO_ARRIVALS) --arrivals-scale $(DEMO_SCALE)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy scheduler

# Re-pin every dependency from a fresh environment (after a change to pyproject.toml).
lock:
	rm -rf .lock-venv && $(PY) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip
	.lock-venv/bin/pip install -q '.[dev]'
	( sed -n '1,2p' $(LOCK); .lock-venv/bin/pip freeze --exclude-editable | grep -v -i '^cosched' \
		| LC_ALL=C sort -f ) > $(LOCK).new && mv $(LOCK).new $(LOCK)
	rm -rf .lock-venv build *.egg-info

# Installs Chromium and chromedriver with apt-get when they are missing (as root, or through
# passwordless sudo). Without either it says what to run and carries on: the browser tests then
# skip with the same advice, except under CI=true, where a missing browser fails the run (a
# suite whose browser tests all skip must not pass). apt-get waits up to 5 min for its lock.
browser-deps:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
		echo "browser-deps: chromium and chromedriver present"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "browser-deps: no apt-get here; install Chromium and chromedriver yourself" \
			"(the browser tests skip without them)"; \
		if [ "$${CI:-}" = true ]; then echo "browser-deps: CI=true needs them: failing"; exit 1; fi; \
	else \
		if [ "$$(id -u)" = 0 ]; then SUDO=; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
		else \
			echo "browser-deps: chromium/chromedriver missing and not root (no passwordless sudo);"; \
			echo "  run: sudo apt-get install -y $(BROWSER_PACKAGES)"; \
			echo "  (the browser tests skip until then)"; \
			if [ "$${CI:-}" = true ]; then echo "browser-deps: CI=true needs them: failing"; exit 1; fi; \
			exit 0; \
		fi; \
		echo "browser-deps: installing $(BROWSER_PACKAGES) with apt-get"; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -q && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
			--no-install-recommends $(BROWSER_PACKAGES) || exit 1; \
		command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
			{ echo "browser-deps: apt-get ran but chromium/chromedriver are still missing"; exit 1; }; \
	fi

# Installs Podman, runc and a static busybox with apt-get when missing (as root, or through
# passwordless sudo), for the container tests (tests/security/test_containers_live.py). Without
# either it says what to run and carries on (those tests then skip), except under CI=true.
container-deps:
	@if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && \
		dpkg -s busybox-static >/dev/null 2>&1; then \
		echo "container-deps: podman, runc and busybox-static present"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "container-deps: no apt-get here; install $(CONTAINER_PACKAGES) yourself" \
			"(the container tests skip without them)"; \
		if [ "$${CI:-}" = true ]; then echo "container-deps: CI=true needs them: failing"; exit 1; fi; \
	else \
		if [ "$$(id -u)" = 0 ]; then SUDO=; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
		else \
			echo "container-deps: $(CONTAINER_PACKAGES) missing and not root (no passwordless sudo);"; \
			echo "  run: sudo apt-get install -y $(CONTAINER_PACKAGES)"; \
			if [ "$${CI:-}" = true ]; then echo "container-deps: CI=true needs them: failing"; exit 1; fi; \
			exit 0; \
		fi; \
		echo "container-deps: installing $(CONTAINER_PACKAGES) with apt-get"; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -q && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
			--no-install-recommends $(CONTAINER_PACKAGES) || exit 1; \
		command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 || \
			{ echo "container-deps: apt-get ran but podman/runc are still missing"; exit 1; }; \
	fi

# `make test`: every test but the few heaviest full-stack ones (marked `slow`: the elastic,
# Slow-Down and seed 004 live runs, the 200-job double-placement run and the quick chaos suite),
# which `make test-slow` runs; CI (.ci/run) runs both.
test: install lint browser-deps container-deps
	$(TEST_ENV) $(BIN)/pytest -m "not slow" --durations=15 $(PYTEST_ARGS)

test-slow: install browser-deps container-deps
	$(TEST_ENV) $(BIN)/pytest -m slow --durations=5 $(PYTEST_ARGS)

# The chaos suite (docs/reliability.md): the real stack on a scratch PostgreSQL database and a
# private Redis, under six faults; prints the table and fails if a job was lost, ran twice,
# ran concurrently or got stuck. CHAOS_ARGS="--quick" for the short variant `make test` runs.
chaos: install
	$(TEST_ENV) TEST_DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
		$(BIN)/python -m tests.e2e.chaos $(CHAOS_ARGS)

# `make gpu-check`: the project's smoke test of a real GPU node (docs/gpu-check.md); run as root
# on the GPU machine from an existing .venv (no network needed). Exits 0 with a message where
# there is no NVIDIA GPU. `make gpu-check-dry` runs the same checks on a virtual GPU.
gpu-check:
	test -x $(BIN)/python || { echo "gpu-check: no $(VENV); run make install first"; exit 2; }
	$(BIN)/python -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

gpu-check-dry:
	$(BIN)/python -m benchmarks.gpu_check --backend virtual --seconds 8 $(GPU_CHECK_ARGS)

bench: install
	$(TEST_ENV) $(BIN)/python -m benchmarks $(BENCH_ARGS)

bench-quick: install
	$(TEST_ENV) $(BIN)/python -m benchmarks --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache .ruff_cache docs/reference
