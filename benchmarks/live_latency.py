"""The live path: submit -> RUNNING latency end to end, and metric ingestion.

Set-up, every part real: a scratch PostgreSQL database (migrated); gunicorn serving
``portal.wsgi`` (2 sync workers, DEBUG off); Redis db 14 (flushed before and after) as broker and
latest-metrics store; one Celery worker (prefork, concurrency 1) on the ``scheduler`` queue; one
node agent as a subprocess (``python -m workers.agent --name bench-gpu --backend virtual --gpus
TitanXpx8 --cores 16 --sample-every 0.5``, with a node token and no database credentials: it
syncs with gunicorn over HTTP every second and at once when the portal nudges it through
Redis). No beat: every cycle here is the one a submission (or a job's end) triggers, as in a
deployment between two beat ticks. The active policy is the default (fifo).

**Submit -> RUNNING.** One client submits jobs one at a time like a CI pipeline would (``POST
/api/v1/jobs/`` with a ``cos_...`` token, ``requests``), one submission every ``INTERVAL_S``
seconds so the cluster is never saturated (at most two or three jobs run at once on 8 GPUs and
16 cores): what is measured is latency, not queueing. Each job is a real process, the job
emulator (``python -m workers.emulate --duration 1.5``), asking 1 GPU and 512 MB. The times come
from the database afterwards: ``Job.submitted_at`` (written by gunicorn when the row is created)
to the ``JobEvent`` with ``to_state`` RUNNING (written by the portal when the agent's sync reports
the attempt started: the scheduler's commit nudges the agent, whose sync gets the attempt, starts
its runner and syncs again at once); the same for SCHEDULED (written by the scheduler worker)
splits it in two. All
processes run on this machine, so their clocks agree. "POST sent -> RUNNING" adds the HTTP
request up to the row's creation (the client's clock before sending). A few warm-up jobs (not
counted) let gunicorn's workers, the scheduler worker and the agent load their code first.

**Ingestion.** While the jobs run, the agent samples (per GPU: utilisation, memory used and
total; per job: progress and slow-down) every ``--sample-every`` and its syncs carry the samples
to the portal, which writes ``MetricSample`` rows; the rows are counted in the database at the
start and the end of the submission phase (``count(*)`` over the node's rows), giving rows/s,
and the distinct sample times of the GPU
rows give the sampler's achieved ticks/s. Then, with every server stopped, the metrics store's
batched insert (``portal.core.metrics.metrics_record``: one ``bulk_create`` in batches of 1,000
rows, then the latest values into Redis) is timed on the scratch database for 100,000 GPU
samples in one call, and for the same rows in agent-sized calls of 24 rows (8 GPUs x 3 metrics).

Full run: 50 jobs, 100,000 rows; ``--quick``: 10 jobs, 10,000 rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import pwd
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks._servers import (
    Running,
    _started,
    _tail,
    celery_worker,
    create_token_user,
    free_port,
    gunicorn,
    manage,
    percentile,
    portal_env,
    scratch_database,
)

DATABASE_NAME = "cosched_bench_live"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
NODE = "bench-gpu"
GPUS = "TitanXpx8"
GPU_COUNT = 8
SAMPLER_INTERVAL_S = 0.5
INTERVAL_S = 1.5  # between two submissions
JOB_DURATION_S = 1.5
JOB_GPU_MEMORY_MB = 512
WARM_UP = 3
JOB_COMMAND = (
    f"python -m workers.emulate --profile bench-live --duration {JOB_DURATION_S} "
    "--report-every 0.25"
)
AGENT_BATCH_ROWS = GPU_COUNT * 3  # what one sampler tick writes for the GPUs

# Times metrics_record on the scratch database; prints one JSON line. {rows}: rows per variant.
INSERT_BENCH = """
import json, time
from datetime import UTC, datetime, timedelta
from portal.core.metrics import Sample, metrics_record
from portal.core.models import Gpu, MetricSample

rows = {rows}
per_call = {per_call}
gpus = list(Gpu.objects.filter(node__name={node!r}).order_by("index").values_list("pk", "node_id"))
base = datetime(2026, 1, 1, tzinfo=UTC)
metrics = ("util_pct", "memory_used_mb", "memory_total_mb")

def samples(offset):
    out = []
    for i in range(rows):
        tick, rest = divmod(i, len(gpus) * len(metrics))
        gpu, metric = divmod(rest, len(metrics))
        out.append(Sample(metrics[metric], float(i % 100), base + timedelta(seconds=offset + tick),
                          gpu_id=gpus[gpu][0], node_id=gpus[gpu][1]))
    return out

result = {{}}
batch = samples(0)
before_rows = MetricSample.objects.count()
started = time.perf_counter()
metrics_record(batch)
result["one_call_s"] = time.perf_counter() - started
batch = samples(10 ** 7)
calls = [batch[i:i + per_call] for i in range(0, len(batch), per_call)]
started = time.perf_counter()
for call in calls:
    metrics_record(call)
result["small_calls_s"] = time.perf_counter() - started
result["calls"] = len(calls)
result["rows_written"] = MetricSample.objects.count() - before_rows
print(json.dumps(result))
"""


def _flush_redis(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


# -- the node agent -----------------------------------------------------------------------------


@contextlib.contextmanager
def node_agent(
    env: dict[str, str], database_url: str, portal_url: str, *, timeout_s: float = 90
) -> Iterator[Running]:
    """Start ``python -m workers.agent`` for ``NODE`` (virtual backend) with a node token made
    for it and none of the portal's credentials (``env``'s ``COSCHED_DATA_DIR`` must be this
    run's own directory); yields once its first sync registered the node in ``database_url``;
    stops it on exit, then kills any job and runner it left behind (the agent deliberately
    leaves running jobs to their runners on shutdown)."""
    import psycopg

    token_file = Path(env["COSCHED_DATA_DIR"]) / f"{NODE}.token"
    manage(["node_token", "create", NODE, "--file", str(token_file)], env)
    args = [
        sys.executable,
        "-m",
        "workers.agent",
        "--name",
        NODE,
        "--portal",
        portal_url,
        "--token-file",
        str(token_file),
        "--nudge-url",
        env["REDIS_URL"],
        "--backend",
        "virtual",
        "--gpus",
        GPUS,
        "--cores",
        "16",
        "--sample-every",
        str(SAMPLER_INTERVAL_S),
        "--run-jobs-as",  # the benchmark's own account (no account switch to measure)
        pwd.getpwuid(os.geteuid()).pw_name,
    ]
    agent_env = {"COSCHED_DATA_DIR": env["COSCHED_DATA_DIR"], "LOG_LEVEL": "WARNING"}
    try:
        with _started(args, agent_env, f"agent-{NODE}") as (log, process):
            deadline = time.monotonic() + timeout_s
            with psycopg.connect(database_url, autocommit=True) as conn:
                while True:
                    if process.poll() is not None:
                        raise RuntimeError(
                            f"node agent exited with {process.returncode}\n--- {log}\n{_tail(log)}"
                        )
                    up = conn.execute(
                        "SELECT 1 FROM core_node WHERE name = %s AND status = 'up'", [NODE]
                    ).fetchone()
                    if up and ": registered;" in log.read_text(errors="replace"):
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"node agent not ready after {timeout_s:.0f} s\n--- {log}\n{_tail(log)}"
                        )
                    time.sleep(0.2)
            yield Running(process=process, log=log, name=f"agent-{NODE}")
    finally:
        _kill_job_processes(NODE, env["COSCHED_DATA_DIR"])


def _kill_job_processes(node: str, data_dir: str) -> list[int]:
    """SIGKILL the runners and jobs our agent started (they carry its marker, derived from its
    state directory under ``data_dir``, this run's own); returns the group ids."""
    from workers.agent import kill_marked_processes, marker_for

    return kill_marked_processes(marker_for(Path(data_dir).absolute() / "agent" / node))


# -- reading the database -----------------------------------------------------------------------


def _wait_terminal(conn: Any, job_ids: list[int], timeout_s: float, logs: list[Path]) -> None:
    """Wait until every job in ``job_ids`` is COMPLETED; raise (with the logs' tails) if one
    fails or they take longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = conn.execute(
            "SELECT id, state, failure_reason FROM core_job WHERE id = ANY(%s)", [job_ids]
        ).fetchall()
        failed = [r for r in rows if r[1] in ("FAILED", "CANCELLED")]
        if failed:
            raise RuntimeError(f"jobs did not complete: {failed[:5]}" + _logs_tail(logs))
        if sum(1 for r in rows if r[1] == "COMPLETED") == len(job_ids):
            return
        if time.monotonic() > deadline:
            states = statistics.multimode(r[1] for r in rows)
            raise TimeoutError(
                f"jobs not all COMPLETED after {timeout_s:.0f} s (most are {states})"
                + _logs_tail(logs)
            )
        time.sleep(0.25)


def _logs_tail(logs: list[Path]) -> str:
    return "".join(f"\n--- {log}\n{_tail(log, 15)}" for log in logs)


def _transition_times(conn: Any, job_ids: list[int]) -> dict[int, dict[str, datetime]]:
    """job id -> {"submitted": .., "SCHEDULED": .., "RUNNING": ..} (first event of each)."""
    times: dict[int, dict[str, datetime]] = {
        job_id: {"submitted": at}
        for job_id, at in conn.execute(
            "SELECT id, submitted_at FROM core_job WHERE id = ANY(%s)", [job_ids]
        ).fetchall()
    }
    for job_id, state, at in conn.execute(
        "SELECT job_id, to_state, min(at) FROM core_jobevent "
        "WHERE job_id = ANY(%s) AND to_state IN ('SCHEDULED', 'RUNNING') GROUP BY 1, 2",
        [job_ids],
    ).fetchall():
        times[job_id][state] = at
    return times


def _agent_rows(conn: Any, node_id: int) -> tuple[int, int]:
    """(GPU rows, per-job rows) the agent of ``node_id`` has written so far."""
    gpu, job = conn.execute(
        "SELECT count(*) FILTER (WHERE gpu_id IS NOT NULL), count(*) FILTER (WHERE job_id IS NOT "
        "NULL) FROM core_metricsample WHERE node_id = %s",
        [node_id],
    ).fetchone()
    return int(gpu), int(job)


def _stats_ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "mean_ms": statistics.fmean(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


# -- the benchmark ------------------------------------------------------------------------------


def _submit_jobs(session: Any, url: str, count: int, prefix: str) -> tuple[list[int], list[float]]:
    """Submit ``count`` jobs one every INTERVAL_S; their ids and the client's send times."""
    ids, sent = [], []
    next_at = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at = time.monotonic() + INTERVAL_S
        body = {
            "name": f"{prefix}-{i}",
            "command": JOB_COMMAND,
            "gpus": 1,
            "gpu_memory_mb": JOB_GPU_MEMORY_MB,
            "cpus": 1,
        }
        sent.append(time.time())
        response = session.post(url, json=body, timeout=30)
        if response.status_code != 201:
            raise RuntimeError(f"POST {url} -> {response.status_code}: {response.text[:500]}")
        ids.append(int(response.json()["id"]))
    return ids, sent


def _insert_benchmark(env: dict[str, str], rows: int) -> dict[str, float]:
    code = INSERT_BENCH.format(rows=rows, per_call=AGENT_BATCH_ROWS, node=NODE)
    out = manage(["shell", "-c", code], env, timeout=1800).stdout.strip().splitlines()[-1]
    result = json.loads(out)
    if result["rows_written"] != 2 * rows:
        raise RuntimeError(f"metrics_record wrote {result['rows_written']} rows, not {2 * rows}")
    return {
        "rows": rows,
        "one_call_s": result["one_call_s"],
        "one_call_rows_per_s": rows / result["one_call_s"],
        "small_calls": result["calls"],
        "small_call_rows": AGENT_BATCH_ROWS,
        "small_calls_s": result["small_calls_s"],
        "small_calls_rows_per_s": rows / result["small_calls_s"],
        "small_call_ms": result["small_calls_s"] / result["calls"] * 1000,
    }


def run(quick: bool = False) -> dict:
    """Measure submit -> RUNNING and metric ingestion; see the module docstring."""
    import psycopg
    import requests

    jobs = 10 if quick else 50
    insert_rows = 10_000 if quick else 100_000
    _flush_redis(REDIS_URL)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="cosched-bench-live-") as data_dir,
            scratch_database(DATABASE_NAME) as database_url,
        ):
            env = portal_env(database_url, REDIS_URL, COSCHED_DATA_DIR=data_dir)
            manage(["migrate", "--noinput"], env)
            key = create_token_user(env, "live-latency benchmark")
            with (
                gunicorn(env, free_port(), workers=2) as server,
                celery_worker(env, ["scheduler"], "bench-scheduler") as scheduler,
                node_agent(env, database_url, server.url) as agent,
                requests.Session() as session,
                psycopg.connect(database_url, autocommit=True) as conn,
            ):
                logs = [server.log, scheduler.log, agent.log]
                session.headers["Authorization"] = f"Token {key}"
                jobs_url = f"{server.url}/api/v1/jobs/"
                node_id = conn.execute(
                    "SELECT id FROM core_node WHERE name = %s", [NODE]
                ).fetchone()[0]

                warm_ids, _ = _submit_jobs(session, jobs_url, WARM_UP, "warm-up")
                _wait_terminal(conn, warm_ids, 120, logs)

                rows_before, wall_before = _agent_rows(conn, node_id), time.time()
                job_ids, sent = _submit_jobs(session, jobs_url, jobs, "bench")
                _wait_terminal(conn, job_ids, 60 + 10 * jobs, logs)
                rows_after, wall_after = _agent_rows(conn, node_id), time.time()
                ticks = conn.execute(
                    "SELECT count(DISTINCT at) FROM core_metricsample WHERE node_id = %s AND "
                    "gpu_id IS NOT NULL AND at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
                    [node_id, wall_before, wall_after],
                ).fetchone()[0]
                times = _transition_times(conn, job_ids)
                placed_on_gpu = conn.execute(
                    "SELECT count(DISTINCT p.job_id) FROM core_placement p JOIN "
                    "core_placement_gpus g ON g.placement_id = p.id WHERE p.job_id = ANY(%s)",
                    [job_ids],
                ).fetchone()[0]
            insert = _insert_benchmark(env, insert_rows)
    finally:
        _flush_redis(REDIS_URL)

    missing = [j for j in job_ids if "RUNNING" not in times[j] or "SCHEDULED" not in times[j]]
    if missing:
        raise RuntimeError(f"jobs without a SCHEDULED or RUNNING event: {missing}")
    ordered = [times[j] for j in job_ids]
    latency = {
        "submit_to_running": _stats_ms(
            [(t["RUNNING"] - t["submitted"]).total_seconds() for t in ordered]
        ),
        "submit_to_scheduled": _stats_ms(
            [(t["SCHEDULED"] - t["submitted"]).total_seconds() for t in ordered]
        ),
        "scheduled_to_running": _stats_ms(
            [(t["RUNNING"] - t["SCHEDULED"]).total_seconds() for t in ordered]
        ),
        "post_sent_to_running": _stats_ms(
            [t["RUNNING"].timestamp() - s for t, s in zip(ordered, sent, strict=True)]
        ),
    }
    window_s = wall_after - wall_before
    gpu_rows = rows_after[0] - rows_before[0]
    job_rows = rows_after[1] - rows_before[1]
    ingestion = {
        "window_s": window_s,
        "rows": gpu_rows + job_rows,
        "rows_per_s": (gpu_rows + job_rows) / window_s,
        "gpu_rows_per_s": gpu_rows / window_s,
        "job_rows_per_s": job_rows / window_s,
        "ticks_per_s": ticks / window_s,
        "nominal_ticks_per_s": 1 / SAMPLER_INTERVAL_S,
    }

    _print_tables(latency, ingestion, insert, jobs, placed_on_gpu)
    s2r = latency["submit_to_running"]
    return {
        "jobs": jobs,
        "jobs_on_gpu": placed_on_gpu,
        "latency": latency,
        "ingestion": ingestion,
        "batched_insert": insert,
        "client": f"requests (sequential), Python {platform.python_version()}",
        "summary": {
            "submit -> RUNNING p50 ms": s2r["p50_ms"],
            "submit -> RUNNING p90 ms": s2r["p90_ms"],
            "submit -> RUNNING max ms": s2r["max_ms"],
            "agent sampler rows/s (8 GPUs, 0.5 s)": ingestion["rows_per_s"],
            f"metrics_record rows/s ({insert_rows:,} rows, one call)": insert[
                "one_call_rows_per_s"
            ],
            f"metrics_record rows/s ({AGENT_BATCH_ROWS}-row calls)": insert[
                "small_calls_rows_per_s"
            ],
        },
    }


def _print_tables(
    latency: dict[str, dict[str, float]],
    ingestion: dict[str, float],
    insert: dict[str, float],
    jobs: int,
    placed_on_gpu: int,
) -> None:
    labels = {
        "submit_to_running": "submitted_at -> RUNNING",
        "submit_to_scheduled": "  submitted_at -> SCHEDULED",
        "scheduled_to_running": "  SCHEDULED -> RUNNING",
        "post_sent_to_running": "POST sent (client) -> RUNNING",
    }
    print(
        f"{'latency':<32} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8} {'min ms':>8} "
        f"{'max ms':>8}"
    )
    for key, label in labels.items():
        row = latency[key]
        print(
            f"{label:<32} {row['n']:>4} {row['p50_ms']:>8.1f} {row['p90_ms']:>8.1f} "
            f"{row['mean_ms']:>8.1f} {row['min_ms']:>8.1f} {row['max_ms']:>8.1f}"
        )
    print(
        f"({jobs} jobs, {placed_on_gpu} placed on a GPU, one submitted every {INTERVAL_S} s, "
        f"each `python -m workers.emulate` for {JOB_DURATION_S} s; gunicorn 2 workers, "
        "1 scheduler worker, 1 virtual node agent syncing over HTTP, PostgreSQL, Redis)"
    )
    print()
    print(
        f"agent sampler ({GPU_COUNT} virtual GPUs, --sample-every {SAMPLER_INTERVAL_S}) over "
        f"{ingestion['window_s']:.1f} s: {ingestion['rows']} rows, "
        f"{ingestion['rows_per_s']:.1f} rows/s (GPU {ingestion['gpu_rows_per_s']:.1f}, "
        f"job {ingestion['job_rows_per_s']:.1f}); {ingestion['ticks_per_s']:.2f} ticks/s "
        f"(nominal {ingestion['nominal_ticks_per_s']:.0f})"
    )
    print(
        f"metrics_record, {insert['rows']:,} rows: one call {insert['one_call_s']:.2f} s = "
        f"{insert['one_call_rows_per_s']:,.0f} rows/s; {insert['small_calls']:,} calls of "
        f"{insert['small_call_rows']} rows {insert['small_calls_s']:.2f} s = "
        f"{insert['small_calls_rows_per_s']:,.0f} rows/s ({insert['small_call_ms']:.2f} ms/call)"
    )


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
