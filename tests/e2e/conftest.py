"""End-to-end stack for the live path: every part a real process.

- gunicorn serving the portal (the API the tests submit through, and the agents' sync endpoint),
- two Celery workers on the ``scheduler`` queue (so cycles race for real), and beat,
- node agents (``python -m workers.agent --backend virtual``, started by the tests): separate
  processes holding only their node token (no database URL), syncing over HTTP, nudged through
  Redis, running each job under a ``workers.runner`` process,

all on pytest-django's PostgreSQL test database and the test Redis database (flushed). Leases
are short (6 s, margin 3 s) so a lost node is noticed in about ten seconds. The stack is started
once per module; the database is flushed when the module ends. Only the GPUs are stand-ins: the
``virtual`` backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.processes import subprocess_database_url

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
# What a node agent is not given: it holds only its node token.
AGENT_HIDDEN = frozenset({"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "TEST_DATABASE_URL"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class Stack:
    url: str
    env: dict[str, str]
    tmp: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def start(
        self, name: str, argv: list[str], replace_env: dict[str, str] | None = None, **env: str
    ) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**(self.env if replace_env is None else replace_env), **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def log_text(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def data_dir(self) -> Path:
        return Path(self.env["COSCHED_DATA_DIR"])

    def start_agent(self, name: str, gpus: str | None = "TitanXpx2", **opts: str) -> None:
        """``python -m workers.agent`` for node ``name`` with a fresh token of its own (the
        test process creates it in the database) and none of the portal's credentials."""
        from portal.core.nodes import node_token_create

        token_file = self.tmp / f"{name}.token"
        if not token_file.exists():
            token_file.write_text(node_token_create(name)[1])
        argv = [str(BIN / "python"), "-m", "workers.agent", "--name", name, "--portal", self.url]
        argv += ["--token-file", str(token_file), "--nudge-url", REDIS_URL]
        argv += ["--backend", "virtual", "--interval", "0.5", "--sample-every", "0.5"]
        # Jobs run as this test's own account (multi-user isolation: tests/security).
        argv += ["--run-jobs-as", pwd.getpwuid(os.geteuid()).pw_name]
        if gpus:
            argv += ["--gpus", gpus]
        for key, value in opts.items():
            argv += [f"--{key.replace('_', '-')}", value]
        env = {k: v for k, v in self.env.items() if k not in AGENT_HIDDEN}
        self.start(f"agent-{name}", argv, replace_env=env)

    def agent_marker(self, name: str) -> str:
        from workers.agent import marker_for

        return marker_for(self.data_dir() / "agent" / name)

    def kill_node(self, name: str) -> None:
        """The node dies: its agent, its runners and its jobs, all at once (SIGKILL)."""
        from workers.agent import kill_marked_processes

        self.stop(f"agent-{name}", sig=signal.SIGKILL)
        kill_marked_processes(self.agent_marker(name))

    # -- the API, as a CI pipeline would use it ----------------------------------------------
    def api(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Token {token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="session")
def stack_database(django_db_setup, django_db_blocker) -> Iterator[None]:
    """The test database for the stack's processes. pytest-django sets it up only when some
    collected test is marked ``django_db``; the module-scoped stacks' tests are not (see
    tests/e2e/test_slowdown_live.py), so run on their own they would reach the development
    database. Then it is set up (and dropped) here."""
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    if connection.settings_dict["NAME"] == connection.creation._get_test_db_name():
        yield
        return
    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    try:
        yield
    finally:
        with django_db_blocker.unblock():
            teardown_databases(config, verbosity=0)


@pytest.fixture(scope="module")
def stack(stack_database, django_db_blocker, tmp_path_factory) -> Iterator[Stack]:
    from django.db import connection

    if connection.vendor != "postgresql":
        reason = "the end-to-end stack needs PostgreSQL (DATABASE_URL)"
        if os.environ.get("CI") == "true":  # CI has PostgreSQL: not a reason to go green
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    import redis

    try:
        redis.Redis.from_url(REDIS_URL).flushdb()
    except redis.exceptions.ConnectionError:
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: start it (see .ci/run)")
    database_url = subprocess_database_url()
    tmp = tmp_path_factory.mktemp("e2e")
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "COSCHED_DATA_DIR": str(tmp / "data"),
        "COSCHED_LEASE_S": "6",
        "COSCHED_LEASE_MARGIN_S": "3",
        "COSCHED_RECONCILE_EVERY_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("TEST_DB_NAME", None)
    port = free_port()
    stack = Stack(url=f"http://127.0.0.1:{port}", env=env, tmp=tmp)
    try:
        stack.start(
            "web",
            [
                str(BIN / "gunicorn"),
                "portal.wsgi",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                "2",
                "--threads",
                "4",
                "--timeout",
                "60",
            ],
        )
        for i in (1, 2):
            stack.start(
                f"scheduler{i}",
                [
                    str(BIN / "celery"),
                    "-A",
                    "portal.celery",
                    "worker",
                    "-Q",
                    "scheduler",
                    "-c",
                    "1",
                    "-P",
                    "solo",
                    "-n",
                    f"sched{i}@%h",
                    "--without-gossip",
                    "--without-mingle",
                    "-l",
                    "info",
                ],
            )
        stack.start(
            "beat",
            [
                str(BIN / "celery"),
                "-A",
                "portal.celery",
                "beat",
                "-l",
                "info",
                "-s",
                str(tmp / "beat-schedule"),
            ],
        )

        def web_up() -> bool:
            try:
                urllib.request.urlopen(stack.url + "/login/", timeout=2)
                return True
            except OSError:
                return False

        wait_for(web_up, 30, what="gunicorn")
        yield stack
    finally:
        for name in list(stack.procs):
            stack.stop(name)
        from workers.agent import kill_marked_processes

        agents = tmp / "data" / "agent"
        for state in agents.iterdir() if agents.exists() else []:
            kill_marked_processes(stack.agent_marker(state.name))  # jobs left to their runners
        with django_db_blocker.unblock():
            from django.core.management import call_command

            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def db_access(django_db_blocker) -> Iterator[None]:
    """Read (and set up) rows the stack's processes write: no test transaction around it."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="module")
def user_token(stack, db_access) -> tuple[Any, str]:
    from django.contrib.auth import get_user_model

    from portal.front.services import token_create

    user = get_user_model().objects.create_user("e2e", "e2e@example.org", "e2e-pass-123")
    _, key = token_create(user, name="e2e")
    return user, key
