"""REST API latency: ``POST /api/v1/jobs/`` and ``GET /api/v1/jobs/?page=1``.

Set-up, all real: a scratch PostgreSQL database (migrated), gunicorn serving ``portal.wsgi`` with
2 sync workers and DEBUG off, Redis db 14 (flushed before and after) as REDIS_URL so every
submission queues its scheduling trigger on the broker as in a deployment (no worker consumes
it here: this measures the web path only). One user with a named API token (``cos_...``, the
kind CI pipelines use). One client on the same machine sends requests one after another over
keep-alive HTTP (``requests``); latency is the client's wall time per request, response read.

Full run: 500 submissions, then 100 list requests with ~500 jobs in the table; ``--quick``: 50
and 20. A few warm-up requests (not counted) let each gunicorn worker load Django first.

Then the load of a CI farm (issue 27): ``CLIENTS`` (40) clients at once, each its own
keep-alive session, submit ``CONCURRENT_POSTS`` (800; quick 160) jobs between them, against two
server set-ups: the compose file's (3 sync workers) and 2 gthread workers of 8 threads. The
per-user and per-token rate limits are lifted for this phase (one token would otherwise be
held to its 20 requests/s: the figure is the server's capacity, not the limit's). Last, bulk
submission: ``POST /api/v1/jobs/bulk/`` with 100 jobs, 5 times (jobs/s). The clients run on
the same 2 cores as the server, PostgreSQL and Redis.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks._servers import (
    create_token_user,
    free_port,
    gunicorn,
    manage,
    percentile,
    portal_env,
    scratch_database,
)

DATABASE_NAME = "cosched_bench_api"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
WARM_UP = 6  # enough for both gunicorn workers to have served a request each
CLIENTS = 40
SETUPS = {"3 sync workers (compose)": (3, 1), "2 gthread workers x 8 threads": (2, 8)}
UNTHROTTLED = {"COSCHED_THROTTLE_USER": "1000000/min", "COSCHED_THROTTLE_TOKEN": "1000000/min"}


def _flush_redis(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


def _timed(call: Callable[[], Any], count: int) -> tuple[list[float], float]:
    """Call ``call`` ``count`` times; per-call latencies (ms) and the total wall time (s)."""
    latencies = []
    started = time.perf_counter()
    for _ in range(count):
        before = time.perf_counter()
        call()
        latencies.append((time.perf_counter() - before) * 1000)
    return latencies, time.perf_counter() - started


def _figures(latencies_ms: list[float], wall_s: float) -> dict[str, float]:
    return {
        "requests": len(latencies_ms),
        "p50_ms": percentile(latencies_ms, 50),
        "p95_ms": percentile(latencies_ms, 95),
        "p99_ms": percentile(latencies_ms, 99),
        "mean_ms": statistics.fmean(latencies_ms),
        "max_ms": max(latencies_ms),
        "requests_per_s": len(latencies_ms) / wall_s,
    }


def _print_table(rows: dict[str, dict[str, float]], jobs_in_table: int) -> None:
    print(
        f"{'request':<34} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'req/s':>7}"
    )
    for label, row in rows.items():
        print(
            f"{label:<34} {row['requests']:>5} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} "
            f"{row['p99_ms']:>8.1f} {row['max_ms']:>8.1f} {row['requests_per_s']:>7.1f}"
        )
    print(
        f"(sequential, one client, gunicorn 2 sync workers, PostgreSQL; "
        f"{jobs_in_table} jobs in the table at the end)"
    )


def run(quick: bool = False) -> dict:
    """Measure the API; returns p50/p95/p99 (ms) and requests/s for POST and GET."""
    import requests

    posts = 50 if quick else 500
    gets = 20 if quick else 100
    _flush_redis(REDIS_URL)
    try:
        with scratch_database(DATABASE_NAME) as database_url:
            env = portal_env(database_url, REDIS_URL)
            manage(["migrate", "--noinput"], env)
            key = create_token_user(env, "api-latency benchmark")
            with gunicorn(env, free_port(), workers=2) as server, requests.Session() as session:
                session.headers["Authorization"] = f"Token {key}"
                jobs_url = f"{server.url}/api/v1/jobs/"
                number = iter(range(1, 10**9))

                def submit() -> None:
                    i = next(number)
                    body = {"name": f"bench-{i}", "command": "sleep 1", "gpus": 0, "cpus": 1}
                    response = session.post(jobs_url, json=body, timeout=30)
                    if response.status_code != 201:
                        raise RuntimeError(
                            f"POST {jobs_url} -> {response.status_code}: {response.text[:500]}"
                        )

                def list_first_page() -> None:
                    response = session.get(jobs_url, params={"page": 1}, timeout=30)
                    if response.status_code != 200 or not response.json().get("results"):
                        raise RuntimeError(
                            f"GET {jobs_url}?page=1 -> {response.status_code}: "
                            f"{response.text[:500]}"
                        )

                _timed(submit, WARM_UP)
                _timed(list_first_page, WARM_UP)
                post = _figures(*_timed(submit, posts))
                jobs_in_table = session.get(jobs_url, timeout=30).json()["count"]
                get = _figures(*_timed(list_first_page, gets))
                queued = _queued_triggers(REDIS_URL)
    finally:
        _flush_redis(REDIS_URL)

    rows = {
        "POST /api/v1/jobs/": post,
        f"GET /api/v1/jobs/?page=1 ({jobs_in_table} jobs)": get,
    }
    _print_table(rows, jobs_in_table)
    print(f"scheduling triggers waiting on the broker afterwards: {queued}")
    farm = run_farm(quick)
    return {
        "farm": farm,
        "post_jobs": post,
        "get_jobs_page_1": get,
        "jobs_in_table": jobs_in_table,
        "broker_messages_after": queued,
        "client": f"requests (sequential, keep-alive), Python {platform.python_version()}",
        "summary": {
            "POST /api/v1/jobs/ p50 ms": post["p50_ms"],
            "POST /api/v1/jobs/ p95 ms": post["p95_ms"],
            "POST /api/v1/jobs/ p99 ms": post["p99_ms"],
            "POST /api/v1/jobs/ requests/s (1 client)": post["requests_per_s"],
            f"GET /api/v1/jobs/?page=1 p50 ms ({jobs_in_table} jobs)": get["p50_ms"],
            "GET /api/v1/jobs/?page=1 p95 ms": get["p95_ms"],
            **{f"{label} req/s": row["requests_per_s"] for label, row in farm.items()},
            **{f"{label} p99 ms": row["p99_ms"] for label, row in farm.items()},
        },
    }


def _concurrent_posts(url: str, key: str, total: int, clients: int) -> dict[str, float]:
    """``total`` submissions from ``clients`` threads at once (each its own session)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import requests

    local = threading.local()
    numbers = iter(range(10**9))
    lock = threading.Lock()

    def one(_: int) -> float:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
            session.headers["Authorization"] = f"Token {key}"
        with lock:
            i = next(numbers)
        body = {"name": f"farm-{i}", "command": "sleep 1", "gpus": 0, "cpus": 1}
        before = time.perf_counter()
        response = session.post(f"{url}/api/v1/jobs/", json=body, timeout=60)
        took = (time.perf_counter() - before) * 1000
        if response.status_code != 201:
            raise RuntimeError(f"POST -> {response.status_code}: {response.text[:300]}")
        return took

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))  # warm: every session connected, workers loaded
        started = time.perf_counter()
        latencies = list(pool.map(one, range(total)))
        wall = time.perf_counter() - started
    return _figures(latencies, wall)


def _bulk_posts(url: str, key: str, batches: int, size: int) -> dict[str, float]:
    import requests

    latencies = []
    started = time.perf_counter()
    with requests.Session() as session:
        session.headers["Authorization"] = f"Token {key}"
        for b in range(batches):
            jobs = [{"name": f"bulk-{b}-{i}", "command": "sleep 1", "gpus": 0} for i in range(size)]
            before = time.perf_counter()
            response = session.post(f"{url}/api/v1/jobs/bulk/", json={"jobs": jobs}, timeout=120)
            latencies.append((time.perf_counter() - before) * 1000)
            if response.status_code != 201:
                raise RuntimeError(f"bulk -> {response.status_code}: {response.text[:300]}")
    wall = time.perf_counter() - started
    row = _figures(latencies, wall)
    row["jobs_per_s"] = batches * size / wall
    return row


def run_farm(quick: bool = False) -> dict[str, dict[str, float]]:
    """The concurrent phase (see the module docstring); one row per server set-up, and bulk."""
    total = 160 if quick else 800
    rows: dict[str, dict[str, float]] = {}
    _flush_redis(REDIS_URL)
    try:
        with scratch_database(DATABASE_NAME) as database_url:
            env = portal_env(database_url, REDIS_URL, **UNTHROTTLED)
            manage(["migrate", "--noinput"], env)
            key = create_token_user(env, "api farm benchmark")
            for label, (workers, threads) in SETUPS.items():
                with gunicorn(env, free_port(), workers=workers, threads=threads) as server:
                    rows[f"POST, {CLIENTS} clients, {label}"] = _concurrent_posts(
                        server.url, key, total, CLIENTS
                    )
            with gunicorn(env, free_port(), workers=3) as server:
                rows["POST /bulk/ (100 jobs), 1 client, 3 sync workers"] = _bulk_posts(
                    server.url, key, 2 if quick else 5, 100
                )
    finally:
        _flush_redis(REDIS_URL)
    print(f"{'load':<52} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7} {'jobs/s':>7}")
    for label, row in rows.items():
        jobs = row.get("jobs_per_s", row["requests_per_s"])
        print(
            f"{label:<52} {row['requests']:>5} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} "
            f"{row['requests_per_s']:>7.1f} {jobs:>7.1f}"
        )
    return rows


def _queued_triggers(url: str) -> int:
    """Messages left in the broker's queues (what the submissions enqueued, coalesced or not)."""
    import redis

    client = redis.Redis.from_url(url)
    return sum(client.llen(key) for key in client.scan_iter() if client.type(key) == b"list")


if __name__ == "__main__":
    import sys

    run(quick="--quick" in sys.argv)
