"""Metrics store: batched recording, latest values (process-local and Redis), downsampled
series, retention, the cluster snapshot and log tails."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from portal.core import metrics
from portal.core.metrics import (
    Sample,
    bucket_average,
    log_tail_get,
    log_tail_store,
    metrics_cluster_snapshot,
    metrics_latest,
    metrics_prune,
    metrics_record,
    metrics_series,
)
from portal.core.models import Gpu, Job, MetricSample, Node

pytestmark = pytest.mark.django_db

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["local", "redis"])
def store(request, settings):
    """Runs a test against the process-local store and against the real Redis."""
    settings.REDIS_URL = REDIS_URL if request.param == "redis" else ""
    metrics.metrics_store_clear()
    yield request.param
    metrics.metrics_store_clear()


@pytest.fixture
def gpu():
    node = Node.objects.create(name="gpu-1", kind="gpu", cores=8)
    return Gpu.objects.create(node=node, index=0, model="V100", memory_mb=16384)


@pytest.fixture
def job(alice):
    return Job.objects.create(owner=alice, name="train", gpus=1, state="RUNNING")


def test_record_is_one_bulk_insert(gpu, django_assert_max_num_queries, settings):
    settings.REDIS_URL = ""
    samples = [
        Sample("util_pct", float(i), T0 + timedelta(seconds=i), gpu_id=gpu.pk) for i in range(500)
    ]
    with django_assert_max_num_queries(1):
        assert metrics_record(samples) == 500
    assert MetricSample.objects.filter(gpu=gpu, metric="util_pct").count() == 500
    assert metrics_record([]) == 0


def test_naive_times_are_refused(gpu):
    with pytest.raises(ValueError, match="time zone"):
        metrics_record([Sample("util_pct", 1.0, datetime(2025, 1, 1), gpu_id=gpu.pk)])


def test_latest_keeps_the_newest_per_entity_and_metric(store, gpu, job):
    metrics_record(
        [
            Sample("util_pct", 40.0, T0, gpu_id=gpu.pk, node_id=gpu.node_id),
            Sample("util_pct", 70.0, T0 + timedelta(seconds=5), gpu_id=gpu.pk),
            Sample("memory_used_mb", 9000.0, T0, gpu_id=gpu.pk),
            Sample("slowdown", 1.25, T0, job_id=job.pk),
            Sample("queue_length", 3.0, T0),
        ]
    )
    # A late batch with an older sample does not overwrite the newer value.
    metrics_record([Sample("util_pct", 10.0, T0 - timedelta(seconds=30), gpu_id=gpu.pk)])
    latest = metrics_latest(gpu_ids=[gpu.pk], job_ids=[job.pk], cluster=True)
    assert latest["gpus"][gpu.pk]["util_pct"]["value"] == 70.0
    assert latest["gpus"][gpu.pk]["util_pct"]["at"] == T0 + timedelta(seconds=5)
    assert latest["gpus"][gpu.pk]["memory_used_mb"]["value"] == 9000.0
    assert latest["jobs"][job.pk] == {"slowdown": {"value": 1.25, "at": T0}}
    assert latest["cluster"]["queue_length"]["value"] == 3.0
    # Only what was asked for comes back.
    assert metrics_latest(gpu_ids=[gpu.pk])["cluster"] == {}
    assert metrics_latest(job_ids=[job.pk + 1000])["jobs"] == {}


def test_latest_falls_back_to_recent_history(store, gpu):
    now = timezone.now()
    metrics_record([Sample("util_pct", 55.0, now, gpu_id=gpu.pk)])
    metrics.metrics_store_clear()  # e.g. Redis flushed, or recorded by another process
    assert metrics_latest(gpu_ids=[gpu.pk])["gpus"][gpu.pk]["util_pct"]["value"] == 55.0


def test_redis_store_is_shared_through_redis(settings, gpu):
    """What one process writes, another reads: the values are in Redis, not in this process."""
    import redis

    settings.REDIS_URL = REDIS_URL
    metrics.metrics_store_clear()
    metrics_record([Sample("util_pct", 33.0, T0, gpu_id=gpu.pk)])
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    packed = raw.hget(f"cosched:latest:gpu:{gpu.pk}", "util_pct")
    assert packed is not None and packed.endswith("|33.0")


def test_log_tails_live_in_the_database_not_in_redis(settings, job):
    """A job's output may hold secrets and Redis may be reachable from jobs: log tails are
    rows only the portal reads; nothing about them is written to Redis."""
    import redis

    settings.REDIS_URL = REDIS_URL
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    raw.flushdb()
    log_tail_store(job.pk, "x" * 10 + "token=s3cret\n")
    log_tail_store(job.pk + 10_000, "a deleted job's tail is dropped\n")
    assert log_tail_get(job.pk) == "x" * 10 + "token=s3cret\n"
    assert log_tail_get(job.pk + 10_000) is None
    assert not any("s3cret" in str(raw.get(k)) for k in raw.scan_iter() if raw.type(k) == "string")
    assert list(raw.scan_iter(match="*log*")) == []
    metrics.JobLogTail.objects.filter(job=job).update(
        updated_at=timezone.now() - timedelta(seconds=metrics.LOG_TAIL_TTL_S + 1)
    )
    assert log_tail_get(job.pk) is None  # a week old: gone from the page, pruned with samples
    metrics.metrics_prune(timedelta(days=14))
    assert not metrics.JobLogTail.objects.filter(job=job).exists()


def test_series_returns_raw_points_up_to_max(gpu):
    metrics_record(
        [Sample("util_pct", float(i), T0 + timedelta(seconds=i), gpu_id=gpu.pk) for i in range(10)]
    )
    points = metrics_series("util_pct", gpu_id=gpu.pk, max_points=10)
    assert points == [(T0 + timedelta(seconds=i), float(i)) for i in range(10)]
    window = metrics_series(
        "util_pct",
        gpu_id=gpu.pk,
        since=T0 + timedelta(seconds=3),
        until=T0 + timedelta(seconds=5),
    )
    assert [v for _at, v in window] == [3.0, 4.0, 5.0]
    assert metrics_series("memory_used_mb", gpu_id=gpu.pk) == []


def test_series_downsampling_bounds_points_and_keeps_the_mean(gpu):
    n = 10_000
    metrics_record(
        [
            Sample("util_pct", float(i % 100), T0 + timedelta(seconds=i), gpu_id=gpu.pk)
            for i in range(n)
        ]
    )
    points = metrics_series("util_pct", gpu_id=gpu.pk, max_points=100)
    assert 90 <= len(points) <= 100
    times = [at for at, _v in points]
    assert times == sorted(times)
    assert times[0] >= T0 and times[-1] <= T0 + timedelta(seconds=n - 1)
    # Each bucket of 100 consecutive seconds averages 0..99 -> 49.5.
    mean = sum(v for _at, v in points) / len(points)
    assert mean == pytest.approx(49.5, abs=1.0)


def test_series_filters_by_entity_and_cluster(gpu, job):
    metrics_record(
        [
            Sample("slowdown", 1.5, T0, job_id=job.pk, gpu_id=gpu.pk),
            Sample("sd_max_diff", 0.2, T0),
            Sample("sd_max_diff", 9.0, T0, job_id=job.pk),  # not a cluster-wide sample
        ]
    )
    assert metrics_series("slowdown", job_id=job.pk) == [(T0, 1.5)]
    assert metrics_series("sd_max_diff") == [(T0, 0.2)]


def test_bucket_average_on_unsorted_rows():
    rows = [(T0 + timedelta(seconds=s), v) for s, v in [(9, 4.0), (0, 1.0), (1, 3.0), (8, 2.0)]]
    out = bucket_average(rows, T0.timestamp(), 9.0, 2)
    assert [v for _at, v in out] == [2.0, 3.0]
    assert out[0][0] == T0 + timedelta(seconds=0.5)


def test_series_on_100k_rows_is_fast(gpu):
    n = 100_000
    table = MetricSample._meta.db_table
    with connection.cursor() as cursor:  # generated in the server: Python-side rows take seconds
        cursor.execute(
            f"INSERT INTO {table} (at, metric, value, gpu_id) "
            "SELECT %s + i * interval '1 second', 'util_pct', i %% 7, %s "
            "FROM generate_series(0, %s) AS i",
            [T0, gpu.pk, n - 1],
        )
    started = time.perf_counter()
    points = metrics_series("util_pct", gpu_id=gpu.pk, max_points=2000)
    elapsed = time.perf_counter() - started
    assert len(points) == 2000
    assert points[0][0] >= T0 and points[-1][0] <= T0 + timedelta(seconds=n - 1)
    assert sum(v for _at, v in points) / len(points) == pytest.approx(3.0, abs=0.1)
    assert elapsed < 1.0, f"downsampling 100k rows took {elapsed:.2f} s"
    print(f"metrics_series over {n} rows: {elapsed * 1000:.0f} ms")


def test_prune_deletes_only_old_samples(gpu):
    now = timezone.now()
    metrics_record(
        [
            Sample("util_pct", 1.0, now - timedelta(days=10), gpu_id=gpu.pk),
            Sample("util_pct", 2.0, now - timedelta(days=8), gpu_id=gpu.pk),
            Sample("util_pct", 3.0, now - timedelta(hours=1), gpu_id=gpu.pk),
        ]
    )
    assert metrics_prune(timedelta(days=7)) == 2
    assert list(MetricSample.objects.values_list("value", flat=True)) == [3.0]
    assert metrics_prune(timedelta(days=7)) == 0


def test_cluster_snapshot(store, alice):
    running = [Job.objects.create(owner=alice, name=f"r{i}", state="RUNNING") for i in range(2)]
    paused = Job.objects.create(owner=alice, name="p", state="PAUSED")
    done = Job.objects.create(owner=alice, name="d", state="COMPLETED")
    for _ in range(3):
        Job.objects.create(owner=alice, name="q", state="PENDING")
    Node.objects.create(name="n-up", kind="cpu")
    Node.objects.create(name="n-down", kind="cpu", status="down")
    metrics_record(
        [
            Sample("slowdown", 1.1, T0, job_id=running[0].pk),
            Sample("slowdown", 1.4, T0, job_id=running[1].pk),
            Sample("slowdown", 2.0, T0, job_id=paused.pk),
            Sample("slowdown", 9.0, T0, job_id=done.pk),  # finished: not counted
        ]
    )
    at = T0 + timedelta(minutes=1)
    samples = metrics_cluster_snapshot(now=at)
    values = {s.metric: s.value for s in samples}
    assert values["queue_length"] == 3
    assert values["running_jobs"] == 2
    assert values["nodes_down"] == 1
    assert values["sd_max_diff"] == pytest.approx(0.9)
    assert all(s.at == at and s.gpu_id is s.job_id is s.node_id is None for s in samples)
    assert metrics_series("queue_length") == [(at, 3.0)]
    assert metrics_latest(cluster=True)["cluster"]["sd_max_diff"]["value"] == pytest.approx(0.9)


def test_log_tail_keeps_the_last_16_kb(store, job):
    assert log_tail_get(job.pk) is None
    text = "".join(f"line {i}\n" for i in range(5000))
    log_tail_store(job.pk, text)
    tail = log_tail_get(job.pk)
    assert len(tail) == metrics.LOG_TAIL_CHARS
    assert text.endswith(tail)
    log_tail_store(job.pk, "short\n")
    assert log_tail_get(job.pk) == "short\n"
