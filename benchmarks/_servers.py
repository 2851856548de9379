"""Real servers for the benchmarks that need them (API, live path).

Everything here starts real processes (gunicorn, Celery workers, ``manage.py``) against a scratch
PostgreSQL database on this machine, and stops what it started even when the benchmark fails.
Logs go to ``var/bench/`` (git-ignored) so a failure can be read afterwards.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "var" / "bench"
PG_ADMIN_URL = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
"""Where scratch databases are created (any database on the server; we connect as its owner)."""

# Variables of the calling shell that must not leak into a benchmark's servers: `make bench`
# exports the test database as DATABASE_URL, and a developer's shell may hold deployment values.
_PORTAL_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "DEBUG",
    "ALLOWED_HOSTS",
    "STATIC_ROOT",
    "COSCHED_DATA_DIR",
    "TEST_DB_NAME",
)


@dataclass(frozen=True)
class Running:
    """A process we started: its handle, where it answers (if it serves HTTP) and its log."""

    process: subprocess.Popen[bytes]
    log: Path
    url: str = ""
    name: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid


# -- small helpers ------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values`` with linear interpolation between the two
    nearest ranks (numpy's default), e.g. ``percentile(latencies_ms, 99)``."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def portal_env(database_url: str, redis_url: str = "", **extra: str) -> dict[str, str]:
    """Environment overrides for a production-like portal process: DEBUG off (no SQL query log,
    no autoreload), a throw-away secret key, plain HTTP on 127.0.0.1, quiet logs.

    With DEBUG off, HTML pages need collected static files (the API does not): call
    ``collect_static(env)`` once before serving pages."""
    env = {
        "STATIC_ROOT": str(LOG_DIR / "staticfiles"),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "0",
        "LOG_LEVEL": "WARNING",
    }
    env.update(extra)
    return env


def _full_env(env: Mapping[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _PORTAL_VARIABLES}
    base.update(env)
    base.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    base["PYTHONUNBUFFERED"] = "1"
    return base


def _log_path(stem: str) -> Path:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    return LOG_DIR / f"{stem}.log"


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group we created, then SIGKILL it if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextlib.contextmanager
def _started(
    args: list[str], env: Mapping[str, str], stem: str
) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    log = _log_path(stem)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            args,
            cwd=ROOT,
            env=_full_env(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: we stop it and its children
        )
    try:
        yield log, process
    finally:
        _stop(process, grace_s=15)


# -- PostgreSQL ---------------------------------------------------------------------------------


def _with_database(url: str, name: str) -> str:
    scheme, rest = url.split("://", 1)
    authority = rest.split("/", 1)[0]
    return f"{scheme}://{authority}/{name}"


@contextlib.contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """Create an empty PostgreSQL database ``name`` (dropping a leftover one first), yield its
    DATABASE_URL, and drop it afterwards (terminating any connection still open)."""
    import psycopg
    from psycopg import sql

    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"scratch database name must be a lowercase identifier, got {name!r}")
    identifier = sql.Identifier(name)

    def execute(statement: sql.Composed) -> None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(statement)

    execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(identifier))
    execute(sql.SQL("CREATE DATABASE {}").format(identifier))
    try:
        yield _with_database(PG_ADMIN_URL, name)
    finally:
        execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(identifier))


# -- manage.py, gunicorn, Celery ----------------------------------------------------------------


def manage(
    args: Sequence[str], env: Mapping[str, str], *, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python manage.py ARGS`` with ``env`` laid over this process's environment (minus
    the portal's own variables); raises with the output if the command fails."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=_full_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done


_CREATE_USER = """
from django.contrib.auth import get_user_model
from portal.front.services import token_create
user = get_user_model().objects.create_user("bench", "bench@example.org", "bench-pass-123")
token, key = token_create(user, name={name!r})
print(key)
"""


def create_token_user(env: Mapping[str, str], token_name: str) -> str:
    """Create the user ``bench`` on the portal's database and return a new API token of it
    (``cos_...``, the kind CI pipelines use)."""
    done = manage(["shell", "-c", _CREATE_USER.format(name=token_name)], env)
    return done.stdout.strip().splitlines()[-1]


def collect_static(env: Mapping[str, str]) -> None:
    """``manage.py collectstatic`` into the env's STATIC_ROOT (needed for pages with DEBUG off)."""
    manage(["collectstatic", "--noinput", "--verbosity", "0"], env)


def wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until ``url`` answers with any HTTP status; fail early if ``process`` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answered (a 3xx/4xx is still an answer)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")
        time.sleep(0.1)


@contextlib.contextmanager
def gunicorn(
    env: Mapping[str, str], port: int, *, workers: int = 2, threads: int = 1
) -> Iterator[Running]:
    """Serve ``portal.wsgi`` with gunicorn on 127.0.0.1:``port`` (sync workers, or gthread
    workers of ``threads`` threads each); yields once it answers HTTP, stops it (and its
    workers) on exit."""
    url = f"http://127.0.0.1:{port}"
    args = [
        sys.executable,
        "-m",
        "gunicorn",
        "portal.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        *(["--threads", str(threads)] if threads > 1 else []),
        "--log-level",
        "warning",
    ]
    with _started(args, env, f"gunicorn-{port}") as (log, process):
        try:
            wait_http(f"{url}/", timeout_s=60, process=process)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"gunicorn did not start: {exc}\n--- {log}\n{_tail(log)}") from exc
        yield Running(process=process, log=log, url=url, name="gunicorn")


def _celery_ping(env: Mapping[str, str], node: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "portal", "inspect", "ping", "-d", node, "-t", "2"],
        cwd=ROOT,
        env=_full_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode == 0 and "pong" in done.stdout


@contextlib.contextmanager
def celery_worker(
    env: Mapping[str, str],
    queues: Sequence[str],
    name: str,
    concurrency: int = 1,
    *,
    timeout_s: float = 60,
) -> Iterator[Running]:
    """Start ``celery -A portal worker`` consuming ``queues`` as node ``name@<host>``; yields once
    it is ready (its "ready." log line, or an ``inspect ping`` answer), stops it on exit."""
    node = f"{name}@{socket.gethostname()}"
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "portal",
        "worker",
        "--queues",
        ",".join(queues),
        "--hostname",
        node,
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    with _started(args, env, f"celery-{name}") as (log, process):
        deadline = time.monotonic() + timeout_s
        next_ping = time.monotonic() + 5
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"celery worker {node} exited early\n--- {log}\n{_tail(log)}")
            if f"{node} ready." in log.read_text(errors="replace"):
                break
            if time.monotonic() > next_ping:
                if _celery_ping(env, node):
                    break
                next_ping = time.monotonic() + 5
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"celery worker {node} not ready after {timeout_s:.0f} s\n"
                    f"--- {log}\n{_tail(log)}"
                )
            time.sleep(0.1)
        yield Running(process=process, log=log, name=node)
