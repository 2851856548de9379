"""What-if replay of the portal's own history: how long a replay of 10,000 finished jobs takes.

Set-up, all real: a scratch PostgreSQL database (migrated) holding a generated history, and one
``manage.py shell`` process that times ``portal.replay.services.replay_run_execute``, the one
call the Celery task ``cosched.replay_run`` makes: export the period from the database (jobs,
profiles, attempts, nodes), write and read back the trace, profiles and cluster files through
the simulator's readers, simulate each policy, compute the comparison and per-user figures, and
write summary.csv, jobs.csv and report.html.

The history (seeded, the same on every run): 14 nodes (4 x 8 V100, 4 x 8 A100, 4 x 8 Titan Xp,
2 CPU nodes), 200 profiles with V100 solo times ``60 * 10**U(1, 2.5)`` s (A100 0.6x, Titan Xp
1.4x; memory 2 to 20 GB), 20 users; jobs of 1, 2 or 4 GPUs (70/20/10 %), 5 % CPU jobs, 10 %
submitted without a profile (exported with their measured run), Poisson arrivals at an offered
load of about 0.8 of the GPUs, each job completed with one attempt on a GPU of its node.
Policies fifo and binpack (the replay page's default), interference class_based.
Full run: 10,000 jobs; ``--quick``: 1,000. Afterwards, on the same history, the time of one
Prometheus exposition (``/metrics``' collector, read from the database at scrape time).
"""

from __future__ import annotations

import json
import time
from typing import Any

from benchmarks._servers import manage, portal_env, scratch_database

DATABASE_NAME = "cosched_bench_replay"
POLICIES = ("fifo", "binpack")
GOAL_S = 60.0
MODELS = (("V100", 1.0), ("A100", 0.6), ("TitanXp", 1.4))


def run(quick: bool = False) -> dict:
    """Seed a history and time one replay of it; returns the figures."""
    jobs = 1_000 if quick else 10_000
    with scratch_database(DATABASE_NAME) as database_url:
        env = portal_env(database_url, COSCHED_DATA_DIR=_data_dir())
        manage(["migrate", "--noinput"], env)
        code = f"from benchmarks.replay_throughput import inside; inside({jobs})"
        done = manage(["shell", "-c", code], env, timeout=1800)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    _print_table(result)
    total = result["replay_s"]
    return {
        **result,
        "summary": {
            f"replay of {jobs:,} jobs, {len(POLICIES)} policies (s)": total,
            "simulator, slowest policy (s)": max(result["policy_wall_s"].values()),
            "/metrics exposition over the history (ms)": result["metrics_scrape_ms"],
            "export + files + comparison + report (s)": total
            - sum(result["policy_wall_s"].values()),
            f"goal < {GOAL_S:.0f} s for 10,000 jobs": (
                ("met" if total < GOAL_S else "NOT met") if not quick else "quick run"
            ),
        },
    }


def _data_dir() -> str:
    from benchmarks._servers import LOG_DIR

    path = LOG_DIR / "replay-data"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _print_table(r: dict[str, Any]) -> None:
    print(
        f"history: {r['jobs']:,} completed jobs, {r['gpus']} GPUs; seeding took {r['seed_s']:.1f} s"
    )
    print(f"{'phase':<44} {'s':>8}")
    for policy, wall in r["policy_wall_s"].items():
        print(f"{'simulate ' + policy:<44} {wall:>8.2f}")
    other = r["replay_s"] - sum(r["policy_wall_s"].values())
    print(f"{'export, files, read-back, comparison, report':<44} {other:>8.2f}")
    print(f"{'whole replay (replay_run_execute)':<44} {r['replay_s']:>8.2f}")
    print(f"status: {r['status']}; runs: {', '.join(r['run_status'])}")
    print(f"/metrics exposition with this history: {r['metrics_scrape_ms']:.1f} ms (median of 5)")


# --- inside the portal process (manage.py shell) ---------------------------------------------


def inside(n_jobs: int) -> None:
    """Seed ``n_jobs`` finished jobs, time one replay, print the figures as one JSON line."""
    from datetime import UTC, datetime, timedelta

    from portal.replay.models import ReplayRun
    from portal.replay.services import replay_run_execute

    t0 = datetime(2026, 1, 5, tzinfo=UTC)
    started = time.perf_counter()
    gpus, span_s = _seed(n_jobs, t0)
    seed_s = time.perf_counter() - started

    run = ReplayRun.objects.create(
        since=t0,
        until=t0 + timedelta(seconds=span_s + 1),
        policies=list(POLICIES),
        interference="class_based",
    )
    started = time.perf_counter()
    run = replay_run_execute(run.pk)
    replay_s = time.perf_counter() - started
    if run.status != "done":
        raise RuntimeError(f"replay failed: {run.error}")
    simulated = [row for row in run.summary if row["policy"] in POLICIES]
    scrape_ms = _scrape_ms()
    print(
        json.dumps(
            {
                "jobs": run.jobs_exported,
                "gpus": gpus,
                "seed_s": seed_s,
                "replay_s": replay_s,
                "status": run.status,
                "run_status": [f"{row['policy']} {row['status']}" for row in simulated],
                "policy_wall_s": {row["policy"]: row["wall_s"] for row in simulated},
                "avg_jct_s": {row["policy"]: row["avg_jct_s"] for row in simulated},
                "metrics_scrape_ms": scrape_ms,
            }
        )
    )


def _scrape_ms(rounds: int = 5) -> float:
    """Median time (ms) of one Prometheus exposition (``portal.core.prometheus``: the custom
    collector's queries over this history, no HTTP) after one warm-up."""
    import statistics

    from portal.core.prometheus import exposition

    exposition()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        exposition()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _seed(n_jobs: int, t0: Any) -> tuple[int, float]:
    """Write the history (module docstring); returns (GPUs, seconds from first to last
    submission)."""
    import random
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from portal.core.models import ApplicationProfile, Gpu, Job, Node, Placement, ProfileGpuTime

    rng = random.Random(19)
    with transaction.atomic():
        users = get_user_model().objects.bulk_create(
            get_user_model()(username=f"user{i:02d}", email=f"u{i}@example.org") for i in range(20)
        )
        nodes: list[tuple[Node, str]] = []
        for model, _speed in MODELS:
            for k in range(4):
                node = Node.objects.create(
                    name=f"{model.lower()}-{k}", kind="gpu", cores=64, memory_mb=512_000
                )
                Gpu.objects.bulk_create(
                    Gpu(
                        node=node,
                        index=i,
                        model=model,
                        memory_mb=32_768 if model != "TitanXp" else 12_288,
                    )
                    for i in range(8)
                )
                nodes.append((node, model))
        cpu_nodes = [Node.objects.create(name=f"cpu-{k}", kind="cpu", cores=64) for k in range(2)]
        Node.objects.update(created_at=t0 - timedelta(days=1))
        gpu_rows = {n.pk: list(n.gpus.order_by("index")) for n, _m in nodes}

        profiles = ApplicationProfile.objects.bulk_create(
            ApplicationProfile(
                name=f"app-{i:03d}",
                kind="dl-train",
                status="approved",
                cpu_time_s=60 * 10 ** rng.uniform(1, 2.5) * 20,
                gpu_memory_max_mb=rng.uniform(2_000, 11_000),
            )
            for i in range(200)
        )
        v100_s = {p.pk: 60 * 10 ** rng.uniform(1, 2.5) for p in profiles}
        ProfileGpuTime.objects.bulk_create(
            ProfileGpuTime(profile=p, gpu_model=model, time_s=v100_s[p.pk] * speed)
            for p in profiles
            for model, speed in MODELS
        )

        gpu_count = 8 * len(nodes)
        mean_gpus = 0.7 * 1 + 0.2 * 2 + 0.1 * 4
        mean_work = 60 * (10**2.5 - 10**1) / (1.5 * 2.302585) * 1.0
        rate = 0.8 * gpu_count / (mean_gpus * mean_work)  # jobs per second
        arrival = 0.0
        rows = []
        for i in range(n_jobs):
            arrival += rng.expovariate(rate)
            cpu = rng.random() < 0.05
            gpus = 0 if cpu else rng.choices((1, 2, 4), weights=(70, 20, 10))[0]
            profile = rng.choice(profiles)
            node, model = (rng.choice(cpu_nodes), None) if cpu else rng.choice(nodes)
            speed = dict(MODELS).get(model, 20.0) if model else 20.0
            run_s = v100_s[profile.pk] * speed * rng.uniform(1.0, 1.3)
            wait_s = rng.expovariate(1 / 120)
            rows.append((i, arrival, wait_s, run_s, gpus, profile, node, model, cpu))
        jobs = Job.objects.bulk_create(
            Job(
                owner=rng.choice(users),
                name=f"bench-{i}",
                command="true",
                gpus=gpus,
                cpus=2,
                profile=None if rng.random() < 0.1 and not cpu else profile,
                state="COMPLETED",
                kind="dl-train",
            )
            for i, _a, _w, _r, gpus, profile, _n, _m, cpu in rows
        )
        with connection.cursor() as cursor:
            cursor.executemany(
                "UPDATE core_job SET submitted_at = %s, started_at = %s, finished_at = %s "
                "WHERE id = %s",
                [
                    (
                        t0 + timedelta(seconds=a),
                        t0 + timedelta(seconds=a + w),
                        t0 + timedelta(seconds=a + w + r),
                        job.pk,
                    )
                    for job, (_i, a, w, r, *_rest) in zip(jobs, rows, strict=True)
                ],
            )
        placements = Placement.objects.bulk_create(
            Placement(
                job=job, attempt=1, node=node, policy="fifo", active=False, outcome="completed"
            )
            for job, (*_head, node, _m, _c) in zip(jobs, rows, strict=True)
        )
        Placement.gpus.through.objects.bulk_create(
            Placement.gpus.through(placement_id=p.pk, gpu_id=g.pk)
            for p, (*_h, gpus, _p, node, model, _c) in zip(placements, rows, strict=True)
            if model is not None
            for g in gpu_rows[node.pk][:gpus]
        )
    return gpu_count, rows[-1][1]


if __name__ == "__main__":
    import sys

    run(quick="--quick" in sys.argv)
