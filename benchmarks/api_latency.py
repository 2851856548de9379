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
server set-ups: the compose file's (3 sync workers) and 2 gthread workers of 8 threads, taken
in turn for ``ROUNDS`` rounds (3; quick 2) so that both meet the same moments of a shared
machine; each round's figures are printed and the median round is reported. The CPU time
that gunicorn, PostgreSQL and the client spent per submission is read from ``/proc`` (Linux)
around each round. The per-user and per-token rate limits are lifted for this phase (one
token would otherwise be held to its 20 requests/s: the figure is the server's capacity, not
the limit's). Last, bulk submission: ``POST /api/v1/jobs/bulk/`` with 100 jobs, 5 times
(jobs/s). The clients run on the same 2 cores as the server, PostgreSQL and Redis.

``python -m benchmarks.api_latency [--quick] [--farm-only] [--rounds N]``; ``make bench`` runs
it as ``api``.
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
ROUNDS = 3
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


def run(quick: bool = False, rounds: int | None = None) -> dict:
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
    farm = run_farm(quick, rounds)
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


def _process_cpu_s(match: Callable[[str], bool]) -> float | None:
    """CPU seconds (user + system) of the live processes whose command line ``match``es,
    from ``/proc``; None where there is no ``/proc``."""
    if not os.path.isdir("/proc/self"):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            if not match(command):
                continue
            with open(f"/proc/{entry.name}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _cpu_shares() -> dict[str, float | None]:
    """CPU seconds so far of gunicorn, PostgreSQL's backends and this (client) process."""
    return {
        "gunicorn": _process_cpu_s(lambda c: "gunicorn" in c and "portal.wsgi" in c),
        "postgres": _process_cpu_s(lambda c: c.startswith("postgres")),
        "client": time.process_time(),
    }


def _median_round(rounds: list[dict[str, float]]) -> dict[str, float]:
    """The round of median submissions/s (the lower middle one of an even count)."""
    ranked = sorted(rounds, key=lambda row: row["requests_per_s"])
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen["rounds"] = len(rounds)
    chosen["requests_per_s_all"] = [round(r["requests_per_s"], 1) for r in rounds]
    chosen["p99_ms_all"] = [round(r["p99_ms"], 1) for r in rounds]
    return chosen


def run_farm(quick: bool = False, rounds: int | None = None) -> dict[str, dict[str, float]]:
    """The concurrent phase (see the module docstring); one row per server set-up (its median
    round), and bulk."""
    total = 160 if quick else 800
    rounds = rounds or (2 if quick else ROUNDS)
    per_setup: dict[str, list[dict[str, float]]] = {label: [] for label in SETUPS}
    rows: dict[str, dict[str, float]] = {}
    _flush_redis(REDIS_URL)
    print(
        f"{'round':<6} {'set-up':<32} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7} "
        f"{'load':>5}  CPU ms a submission: gunicorn / postgres / client"
    )
    try:
        with scratch_database(DATABASE_NAME) as database_url:
            env = portal_env(database_url, REDIS_URL, **UNTHROTTLED)
            manage(["migrate", "--noinput"], env)
            key = create_token_user(env, "api farm benchmark")
            for round_no in range(1, rounds + 1):
                for label, (workers, threads) in SETUPS.items():
                    with gunicorn(env, free_port(), workers=workers, threads=threads) as server:
                        before = _cpu_shares()
                        row = _concurrent_posts(server.url, key, total, CLIENTS)
                        after = _cpu_shares()
                    requests_made = total + CLIENTS  # the warm-up round included
                    for part, start in before.items():
                        end = after[part]
                        if start is not None and end is not None:
                            row[f"cpu_ms_{part}"] = 1000 * (end - start) / requests_made
                    row["load_average"] = os.getloadavg()[0]
                    per_setup[label].append(row)
                    cpu = " / ".join(
                        f"{row[f'cpu_ms_{part}']:.1f}" if f"cpu_ms_{part}" in row else "?"
                        for part in ("gunicorn", "postgres", "client")
                    )
                    print(
                        f"{round_no:<6} {label:<32} {row['requests']:>5} {row['p50_ms']:>8.1f} "
                        f"{row['p99_ms']:>8.1f} {row['requests_per_s']:>7.1f} "
                        f"{row['load_average']:>5.1f}  {cpu}",
                        flush=True,
                    )
            for label, measured in per_setup.items():
                rows[f"POST, {CLIENTS} clients, {label}"] = _median_round(measured)
            with gunicorn(env, free_port(), workers=3) as server:
                rows["POST /bulk/ (100 jobs), 1 client, 3 sync workers"] = _bulk_posts(
                    server.url, key, 2 if quick else 5, 100
                )
    finally:
        _flush_redis(REDIS_URL)
    print(f"median round of {rounds}:")
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


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.api_latency",
        description="The REST API's latency (one client) and a CI farm's load (40 clients, "
        "alternating server set-ups, median round), against a scratch PostgreSQL database.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument(
        "--farm-only", action="store_true", help="only the 40-client phase and bulk submission"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"farm rounds per set-up ({ROUNDS}; quick 2)"
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds: give 1 or more")
    if args.farm_only:
        run_farm(args.quick, args.rounds)
    else:
        run(args.quick, args.rounds)


if __name__ == "__main__":
    main()
