"""Live metrics: history in the database, latest values and log tails in a fast store.

History: ``MetricSample`` rows, written in one ``bulk_create`` per batch, pruned by age
(``metrics_prune``) and read downsampled (``metrics_series`` never returns more than
``max_points`` points: above that it averages fixed-width time buckets, in SQL on PostgreSQL).

Latest values live in Redis when ``settings.REDIS_URL`` is set (keys prefixed ``cosched:``),
else in a process-local dict (the embedded default runs in one process). The latest store
keeps, per entity and metric, the newest sample by time: a late batch never overwrites a newer
value. Job log tails live in the database (``JobLogTail``), never in Redis: a job's output may
hold secrets and Redis may be reachable from where jobs run (docs/security.md).

Metric names and units: ``util_pct`` (percent), ``memory_used_mb`` / ``memory_total_mb`` (MB),
``slowdown`` (unitless SD_i, ALGORITHMS.md §5), ``progress`` (0..1), ``queue_length``,
``running_jobs``, ``nodes_down`` (counts), ``sd_max_diff`` (unitless, ALGORITHMS.md §5).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, Min, QuerySet
from django.utils import timezone

from portal.core.models import Job, JobLogTail, MetricSample, Node
from portal.core.states import JobState

KEY_PREFIX = "cosched:"
LOG_TAIL_CHARS = 16 * 1024
LOG_TAIL_TTL_S = 7 * 24 * 3600
DEFAULT_MAX_POINTS = 2000
# Metrics the cluster snapshot records (all three ids None).
CLUSTER_METRICS = ("queue_length", "running_jobs", "nodes_down", "sd_max_diff")


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement. All three ids None: a cluster-wide sample."""

    metric: str
    value: float
    at: datetime  # timezone-aware
    gpu_id: int | None = None  # portal.core.models.Gpu pk
    node_id: int | None = None  # Node pk
    job_id: int | None = None  # Job pk


# --- latest store -------------------------------------------------------------------------------
#
# An entity is "gpu:<id>", "job:<id>", "node:<id>" or "cluster". Each holds metric -> (epoch s,
# value). A sample with a gpu id is filed under the GPU; with a job id under the job (a per-job
# sample on a GPU is filed under both); with only a node id under the node.


def _entities(sample: Sample) -> list[str]:
    keys = []
    if sample.gpu_id is not None:
        keys.append(f"gpu:{sample.gpu_id}")
    if sample.job_id is not None:
        keys.append(f"job:{sample.job_id}")
    if sample.node_id is not None and not keys:
        keys.append(f"node:{sample.node_id}")
    if not keys:
        keys.append("cluster")
    return keys


def _newest(samples: Iterable[Sample]) -> dict[str, dict[str, tuple[float, float]]]:
    """entity -> metric -> (epoch seconds, value), keeping the newest sample of each pair."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for s in samples:
        ts = s.at.timestamp()
        for entity in _entities(s):
            current = out.setdefault(entity, {}).get(s.metric)
            if current is None or ts >= current[0]:
                out[entity][s.metric] = (ts, float(s.value))
    return out


class _LocalStore:
    """Process-local latest values and log tails (embedded default, one process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, dict[str, tuple[float, float]]] = {}

    def put_latest(self, newest: dict[str, dict[str, tuple[float, float]]]) -> None:
        with self._lock:
            for entity, metrics in newest.items():
                held = self._latest.setdefault(entity, {})
                for metric, (ts, value) in metrics.items():
                    if metric not in held or ts >= held[metric][0]:
                        held[metric] = (ts, value)

    def get_latest(self, entities: list[str]) -> dict[str, dict[str, tuple[float, float]]]:
        with self._lock:
            return {e: dict(self._latest[e]) for e in entities if e in self._latest}

    def clear(self) -> None:
        with self._lock:
            self._latest.clear()


# Sets field to "<epoch>|<value>" only if the stored epoch is older (or the field is absent).
_REDIS_PUT_IF_NEWER = """
local n = 0
for i = 1, #ARGV, 3 do
  local field, ts, packed = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local old = redis.call('HGET', KEYS[1], field)
  local old_ts = nil
  if old then old_ts = tonumber(string.match(old, '^([^|]+)|')) end
  if (not old_ts) or ts >= old_ts then
    redis.call('HSET', KEYS[1], field, packed)
    n = n + 1
  end
end
return n
"""


class _RedisStore:
    """Latest values as one hash per entity (``cosched:latest:<entity>``)."""

    def __init__(self, url: str) -> None:
        import redis  # imported here: the embedded default runs without Redis

        self.url = url
        self._client = redis.Redis.from_url(url, decode_responses=True)
        self._put = self._client.register_script(_REDIS_PUT_IF_NEWER)

    def put_latest(self, newest: dict[str, dict[str, tuple[float, float]]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for entity, metrics in newest.items():
            args: list[Any] = []
            for metric, (ts, value) in metrics.items():
                args += [metric, repr(ts), f"{ts!r}|{value!r}"]
            self._put(keys=[f"{KEY_PREFIX}latest:{entity}"], args=args, client=pipe)
        pipe.execute()

    def get_latest(self, entities: list[str]) -> dict[str, dict[str, tuple[float, float]]]:
        pipe = self._client.pipeline(transaction=False)
        for entity in entities:
            pipe.hgetall(f"{KEY_PREFIX}latest:{entity}")
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for entity, raw in zip(entities, pipe.execute(), strict=True):
            if raw:
                out[entity] = {m: _unpack(v) for m, v in raw.items()}
        return out

    def clear(self) -> None:
        keys = list(self._client.scan_iter(match=f"{KEY_PREFIX}latest:*"))
        if keys:
            self._client.delete(*keys)


def _unpack(packed: str) -> tuple[float, float]:
    ts, value = packed.split("|", 1)
    return float(ts), float(value)


_local_store = _LocalStore()
_redis_stores: dict[str, _RedisStore] = {}
_redis_lock = threading.Lock()


def _store() -> _LocalStore | _RedisStore:
    """Redis when ``settings.REDIS_URL`` is set (read on each call, so tests can switch)."""
    url = getattr(settings, "REDIS_URL", "") or ""
    if not url:
        return _local_store
    with _redis_lock:
        store = _redis_stores.get(url)
        if store is None:
            store = _redis_stores[url] = _RedisStore(url)
        return store


def metrics_store_clear() -> None:
    """Forget every latest value in the active store (tests, ``flush`` tools). Log tails are
    rows (``JobLogTail``): a database flush removes them."""
    _store().clear()


# --- recording ----------------------------------------------------------------------------------


def metrics_record(samples: Iterable[Sample]) -> int:
    """Store ``samples``: one ``bulk_create`` into ``MetricSample``, then the latest store.

    Returns the number of samples stored. Naive datetimes are rejected (ValueError).
    """
    batch = list(samples)
    if not batch:
        return 0
    for s in batch:
        if timezone.is_naive(s.at):
            raise ValueError(f"metric {s.metric}: sample time {s.at} has no time zone")
    MetricSample.objects.bulk_create(
        [
            MetricSample(
                at=s.at,
                metric=s.metric,
                value=float(s.value),
                gpu_id=s.gpu_id,
                node_id=s.node_id,
                job_id=s.job_id,
            )
            for s in batch
        ],
        batch_size=1000,
    )
    _store().put_latest(_newest(batch))
    return len(batch)


# --- latest -------------------------------------------------------------------------------------


def metrics_latest(
    *,
    gpu_ids: Iterable[int] | None = None,
    job_ids: Iterable[int] | None = None,
    node_ids: Iterable[int] | None = None,
    cluster: bool = False,
) -> dict[str, Any]:
    """Latest value of every metric per entity asked for.

    Returns ``{"gpus": {gpu_id: {metric: {"value": float, "at": datetime}}}, "jobs": {...},
    "nodes": {...}, "cluster": {metric: {...}}}``; entities with no value are absent (and
    ``"cluster"`` is ``{}`` unless asked for). Values come from the latest store; an entity the
    store does not hold (e.g. the store was flushed, or another process recorded it without
    Redis) is looked up in the recent database history (last hour).
    """
    wanted: list[tuple[str, str, int | None]] = []
    for group, prefix, ids in (
        ("gpus", "gpu", gpu_ids),
        ("jobs", "job", job_ids),
        ("nodes", "node", node_ids),
    ):
        for pk in ids or ():
            wanted.append((group, f"{prefix}:{int(pk)}", int(pk)))
    if cluster:
        wanted.append(("cluster", "cluster", None))
    held = _store().get_latest([entity for _g, entity, _pk in wanted]) if wanted else {}
    missing = [(g, e, pk) for g, e, pk in wanted if e not in held]
    if missing:
        held.update(_latest_from_db(missing))

    out: dict[str, Any] = {"gpus": {}, "jobs": {}, "nodes": {}, "cluster": {}}
    for group, entity, pk in wanted:
        metrics = held.get(entity)
        if not metrics:
            continue
        values = {
            metric: {"value": value, "at": datetime.fromtimestamp(ts, tz=UTC)}
            for metric, (ts, value) in metrics.items()
        }
        if group == "cluster":
            out["cluster"] = values
        else:
            out[group][pk] = values
    return out


def _latest_from_db(
    wanted: list[tuple[str, str, int | None]], window: timedelta = timedelta(hours=1)
) -> dict[str, dict[str, tuple[float, float]]]:
    since = timezone.now() - window
    by_field: dict[str, set[int]] = {"gpu_id": set(), "job_id": set(), "node_id": set()}
    want_cluster = False
    for group, _entity, pk in wanted:
        if group == "cluster":
            want_cluster = True
        else:
            by_field[{"gpus": "gpu_id", "jobs": "job_id", "nodes": "node_id"}[group]].add(pk)
    found: list[Sample] = []
    for field, ids in by_field.items():
        if not ids:
            continue
        qs = MetricSample.objects.filter(at__gte=since, **{f"{field}__in": ids})
        if field == "node_id":
            qs = qs.filter(gpu_id=None, job_id=None)
        rows = qs.values_list("metric", "value", "at", "gpu_id", "node_id", "job_id")
        found += [Sample(m, v, at, g, n, j) for m, v, at, g, n, j in rows.iterator()]
    if want_cluster:
        rows = _cluster_qs().filter(at__gte=since).values_list("metric", "value", "at")
        found += [Sample(m, v, at) for m, v, at in rows.iterator()]
    newest = _newest(found)
    return {e: newest[e] for _g, e, _pk in wanted if e in newest}


# --- history ------------------------------------------------------------------------------------


def _cluster_qs() -> QuerySet[MetricSample]:
    return MetricSample.objects.filter(gpu_id=None, job_id=None, node_id=None)


def metrics_series(
    metric: str,
    *,
    gpu_id: int | None = None,
    job_id: int | None = None,
    node_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[tuple[datetime, float]]:
    """``(at, value)`` points of one series, oldest first, at most ``max_points`` of them.

    The series is the samples of ``metric`` for the given GPU / job / node (each id given is a
    filter); with no id at all, the cluster-wide samples. ``since`` / ``until`` bound the time
    (inclusive). Up to ``max_points`` samples come back as stored; above that the time range is
    cut into ``max_points`` equal buckets and each non-empty bucket gives one point: the mean
    time and mean value of its samples.
    """
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    if gpu_id is None and job_id is None and node_id is None:
        qs = _cluster_qs().filter(metric=metric)
    else:
        qs = MetricSample.objects.filter(metric=metric)
        if gpu_id is not None:
            qs = qs.filter(gpu_id=gpu_id)
        if job_id is not None:
            qs = qs.filter(job_id=job_id)
        if node_id is not None:
            qs = qs.filter(node_id=node_id)
    if since is not None:
        qs = qs.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lte=until)

    stats = qs.order_by().aggregate(n=Count("id"), first=Min("at"), last=Max("at"))
    if not stats["n"]:
        return []
    if stats["n"] <= max_points:
        return list(qs.order_by("at", "id").values_list("at", "value"))
    start = stats["first"].timestamp()
    span = stats["last"].timestamp() - start
    if connection.vendor == "postgresql":
        return _buckets_sql(qs, start, span, max_points)
    rows = qs.order_by("at", "id").values_list("at", "value").iterator(chunk_size=5000)
    return bucket_average(rows, start, span, max_points)


def _bucket_index(ts: float, start: float, span: float, max_points: int) -> int:
    if span <= 0:
        return 0
    return min(max_points - 1, int((ts - start) / span * max_points))


def bucket_average(
    rows: Iterable[tuple[datetime, float]], start: float, span: float, max_points: int
) -> list[tuple[datetime, float]]:
    """Mean time and value per bucket; ``start`` (epoch s) and ``span`` (s) cover the rows,
    cut into ``max_points`` buckets. Rows need not be sorted; the result is, by time."""
    sums: dict[int, list[float]] = {}
    for at, value in rows:
        ts = at.timestamp()
        acc = sums.setdefault(_bucket_index(ts, start, span, max_points), [0.0, 0.0, 0])
        acc[0] += ts
        acc[1] += value
        acc[2] += 1
    return [
        (datetime.fromtimestamp(t / n, tz=UTC), v / n) for _b, (t, v, n) in sorted(sums.items())
    ]


def _buckets_sql(
    qs: QuerySet[MetricSample], start: float, span: float, max_points: int
) -> list[tuple[datetime, float]]:
    inner, params = qs.order_by().values("at", "value").query.sql_with_params()
    width = span / max_points if span > 0 else 1.0
    sql = (
        "SELECT avg(extract(epoch FROM s.at)) AS t, avg(s.value) AS v FROM ("
        f"{inner}) s GROUP BY LEAST(%s, floor((extract(epoch FROM s.at) - %s) / %s)) ORDER BY t"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, max_points - 1, start, width])
        return [(datetime.fromtimestamp(float(t), tz=UTC), float(v)) for t, v in cursor.fetchall()]


def metrics_prune(older_than: timedelta) -> int:
    """Delete samples and per-job GPU readings older than ``older_than`` from now
    (retention); returns how many. Observations (``JobObservation``) are kept: they are what
    the scheduler learns from."""
    from portal.core.models import GpuReading

    cutoff = timezone.now() - older_than
    deleted, _per_model = MetricSample.objects.filter(at__lt=cutoff).delete()
    readings, _ = GpuReading.objects.filter(at__lt=cutoff).delete()
    stale = timezone.now() - timedelta(seconds=LOG_TAIL_TTL_S)
    JobLogTail.objects.filter(updated_at__lt=stale).delete()
    return deleted + readings


# --- cluster snapshot ---------------------------------------------------------------------------


def metrics_cluster_snapshot(now: datetime | None = None) -> list[Sample]:
    """Compute and record the cluster-wide metrics at ``now`` (default: the current time).

    ``queue_length``: PENDING jobs; ``running_jobs``: RUNNING jobs; ``nodes_down``: nodes DOWN;
    ``sd_max_diff``: max - min of the latest per-job ``slowdown`` over RUNNING and PAUSED jobs
    (ALGORITHMS.md §5, ``workers.slowdown.sd_max_diff``; 0 below two known values).
    """
    from workers.slowdown import sd_max_diff

    at = now or timezone.now()
    counts = dict(
        Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING])
        .order_by()
        .values_list("state")
        .annotate(n=Count("id"))
    )
    placed = list(
        Job.objects.filter(state__in=[JobState.RUNNING, JobState.PAUSED]).values_list(
            "id", flat=True
        )
    )
    latest = metrics_latest(job_ids=placed)["jobs"] if placed else {}
    slowdowns = [m["slowdown"]["value"] for m in latest.values() if "slowdown" in m]
    samples = [
        Sample("queue_length", float(counts.get(JobState.PENDING, 0)), at),
        Sample("running_jobs", float(counts.get(JobState.RUNNING, 0)), at),
        Sample("nodes_down", float(Node.objects.filter(status=Node.Status.DOWN).count()), at),
        Sample("sd_max_diff", float(sd_max_diff(slowdowns)), at),
    ]
    metrics_record(samples)
    return samples


# --- log tails ----------------------------------------------------------------------------------


def log_tails_store(tails: dict[int, str]) -> None:
    """Keep the last ``LOG_TAIL_CHARS`` characters of each job's log (job id -> text) for the
    job page: one upsert for all of them."""
    if not tails:
        return
    now = timezone.now()
    known = set(Job.objects.filter(pk__in=[int(j) for j in tails]).values_list("pk", flat=True))
    rows = [
        JobLogTail(job_id=int(job_id), text=text[-LOG_TAIL_CHARS:], updated_at=now)
        for job_id, text in tails.items()
        if int(job_id) in known  # a job deleted meanwhile has no page to show it on
    ]
    if not rows:
        return
    JobLogTail.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["job"],
        update_fields=["text", "updated_at"],
    )


def log_tail_store(job_id: int, text: str) -> None:
    """``log_tails_store`` for one job."""
    log_tails_store({int(job_id): text})


def log_tail_get(job_id: int) -> str | None:
    """The stored log tail of a job, or None when there is none (or it is older than
    ``LOG_TAIL_TTL_S``)."""
    cutoff = timezone.now() - timedelta(seconds=LOG_TAIL_TTL_S)
    return (
        JobLogTail.objects.filter(job_id=int(job_id), updated_at__gte=cutoff)
        .values_list("text", flat=True)
        .first()
    )
