"""Prometheus ``/metrics`` (docs/metrics.md): the cluster as Prometheus and Grafana see it.

Everything but the decision latency is read from the database and the live metrics store at
scrape time by one custom collector (``CoschedCollector``): the web workers, the scheduler
workers and the node agents are separate processes, and the database already holds the truth, so
no counter has to be kept in step across processes. The decision latency is measured in the
scheduler workers (``portal.core.scheduling.run_cycle``) and added to bucket counters in Redis
(``cosched:prom:*``; a process-local dict without Redis, as in the embedded default), which the
collector reads back as a histogram.

Names follow NVIDIA's DCGM exporter where they mean the same (``DCGM_FI_DEV_GPU_UTIL``,
``DCGM_FI_DEV_FB_USED``, ``DCGM_FI_DEV_FB_FREE``, with its ``gpu``, ``UUID``, ``modelName`` and
``Hostname`` labels plus ``node``), so dashboards written for the exporter work on the virtual
cluster too; everything else is ``cosched_*``. Units: seconds, MiB, percent.

Access (``settings.COSCHED``): ``METRICS_TOKEN`` (a bearer token Prometheus sends) and
``METRICS_ALLOWED_NETWORKS`` (addresses or CIDR networks that need no token; loopback by
default). A request passes with the right token or from an allowed address.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from portal.core.models import Gpu, GpuReading, Job, Node, Placement
from portal.core.states import PLACED, JobState

log = logging.getLogger(__name__)

# Upper bounds (s) of the decision latency buckets: a policy decides in milliseconds on a small
# cluster, up to seconds for 10,000 queued jobs (docs/benchmarks.md).
DECISION_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Upper bounds (s) of the queueing delay buckets (submission -> start).
WAIT_BUCKETS_S: tuple[float, ...] = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
# A GPU reading older than this is not exported (its agent stopped reporting; Prometheus marks
# the series stale instead of repeating an old value).
STALE_AFTER_S = 300.0
DEFAULT_ALLOWED_NETWORKS = ("127.0.0.0/8", "::1/128")
_PREFIX = "cosched:prom:"


# --- the decision latency, across processes ------------------------------------------------------


class _LocalHistograms:
    """Bucket counters in this process (the embedded default runs everything in one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, float]] = {}

    def add(self, increments: dict[str, dict[str, float]]) -> None:
        with self._lock:
            for name, fields in increments.items():
                held = self._data.setdefault(name, {})
                for key, value in fields.items():
                    held[key] = held.get(key, 0.0) + value

    def read(self, name: str) -> dict[str, float]:
        with self._lock:
            return dict(self._data.get(name, {}))

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


class _RedisHistograms:
    """Bucket counters as one Redis hash per histogram (``cosched:prom:<name>``)."""

    def __init__(self, url: str) -> None:
        import redis  # imported here: the embedded default runs without Redis

        # Short timeouts: a scheduling cycle must not wait on a sick Redis for its statistics.
        self._client = redis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=1, socket_timeout=1
        )

    def add(self, increments: dict[str, dict[str, float]]) -> None:
        pipe = self._client.pipeline(transaction=True)
        for name, fields in increments.items():
            for key, value in fields.items():
                pipe.hincrbyfloat(_PREFIX + name, key, value)
        pipe.execute()

    def read(self, name: str) -> dict[str, float]:
        return {k: float(v) for k, v in self._client.hgetall(_PREFIX + name).items()}

    def clear(self) -> None:
        keys = list(self._client.scan_iter(match=_PREFIX + "*"))
        if keys:
            self._client.delete(*keys)


_local = _LocalHistograms()
# After Redis failed, cycles skip recording for this long (s).
PAUSE_AFTER_FAILURE_S = 30.0
_pause_until = 0.0
_redis: dict[str, _RedisHistograms] = {}
_redis_lock = threading.Lock()


def _histograms() -> _LocalHistograms | _RedisHistograms:
    url = getattr(settings, "REDIS_URL", "") or ""
    if not url:
        return _local
    with _redis_lock:
        if url not in _redis:
            _redis[url] = _RedisHistograms(url)
        return _redis[url]


def _bucket_fields(value: float, bounds: Sequence[float]) -> dict[str, float]:
    """Counter increments for one observation: the first bucket it falls in (cumulated when
    read), the sum and the count."""
    fields = {"sum": float(value), "count": 1.0}
    for bound in bounds:
        if value <= bound:
            fields[repr(float(bound))] = 1.0
            break
    else:
        fields["+Inf"] = 1.0
    return fields


def observe_decision_latency(policy_s: float, cycle_s: float) -> None:
    """Count one scheduling cycle: ``policy_s`` seconds in the policy, ``cycle_s`` in the whole
    cycle (snapshot, policy, writes). Best effort: a failure is logged, never raised."""
    global _pause_until
    if time.monotonic() < _pause_until:
        return
    try:
        _histograms().add(
            {
                "decision": _bucket_fields(policy_s, DECISION_BUCKETS_S),
                "cycle": _bucket_fields(cycle_s, DECISION_BUCKETS_S),
            }
        )
    except Exception as exc:  # Redis down: the cycle goes on, the statistics miss points
        # and the next cycles do not wait on Redis's timeouts for a while.
        _pause_until = time.monotonic() + PAUSE_AFTER_FAILURE_S
        log.warning("decision latency not recorded: %s", exc)


def decision_latency_clear() -> None:
    """Forget the recorded latencies (tests)."""
    global _pause_until
    _pause_until = 0.0
    _histograms().clear()


def _histogram_family(
    name: str, doc: str, stored: dict[str, float], bounds: Sequence[float]
) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    running = 0.0
    for bound in bounds:
        running += stored.get(repr(float(bound)), 0.0)
        buckets.append((_le(bound), running))
    running += stored.get("+Inf", 0.0)
    buckets.append(("+Inf", running))
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], buckets, sum_value=stored.get("sum", 0.0))
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


# --- the collector ----------------------------------------------------------------------------


class CoschedCollector(Collector):
    """Reads the cluster at scrape time (a handful of queries; see the module docstring)."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now or timezone.now()
        yield from _gpu_families(now)
        yield from _job_families(now)
        yield from _node_families(now)
        stored_decision = _read_histogram("decision")
        stored_cycle = _read_histogram("cycle")
        yield _histogram_family(
            "cosched_decision_latency_seconds",
            "Time the active policy took to decide, per scheduling cycle (s)",
            stored_decision,
            DECISION_BUCKETS_S,
        )
        yield _histogram_family(
            "cosched_cycle_duration_seconds",
            "Time of a whole scheduling cycle: snapshot, policy and writes (s)",
            stored_cycle,
            DECISION_BUCKETS_S,
        )


def _read_histogram(name: str) -> dict[str, float]:
    try:
        return _histograms().read(name)
    except Exception as exc:  # Redis down: the scrape still answers, with empty counters
        log.warning("decision latency not readable: %s", exc)
        return {}


def _gpu_families(now: datetime) -> Iterable[Metric]:
    from portal.core.metrics import metrics_latest

    labels = ["gpu", "UUID", "modelName", "Hostname", "node"]
    util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (%)", labels=labels)
    used = GaugeMetricFamily(
        "DCGM_FI_DEV_FB_USED", "GPU framebuffer memory used (MiB)", labels=labels
    )
    free = GaugeMetricFamily(
        "DCGM_FI_DEV_FB_FREE", "GPU framebuffer memory free (MiB)", labels=labels
    )
    allocated = GaugeMetricFamily(
        "cosched_gpu_jobs",
        "Jobs whose active attempt holds the GPU (a shared GPU holds several)",
        labels=["gpu", "modelName", "node"],
    )
    gpus = list(Gpu.objects.select_related("node").order_by("node__name", "index"))
    held: dict[int, int] = dict(
        Placement.gpus.through.objects.filter(
            placement__active=True, placement__job__state__in=[s.value for s in PLACED]
        )
        .values_list("gpu_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    latest = metrics_latest(gpu_ids=[g.pk for g in gpus])["gpus"] if gpus else {}
    fresh_after = now - timedelta(seconds=STALE_AFTER_S)
    for g in gpus:
        values = [str(g.index), g.uuid, g.model, g.node.name, g.node.name]
        allocated.add_metric([str(g.index), g.model, g.node.name], float(held.get(g.pk, 0)))
        readings = {
            metric: reading["value"]
            for metric, reading in latest.get(g.pk, {}).items()
            if reading["at"] >= fresh_after
        }
        if "util_pct" in readings:
            util.add_metric(values, readings["util_pct"])
        if "memory_used_mb" in readings:
            used.add_metric(values, readings["memory_used_mb"])
            total = readings.get("memory_total_mb", float(g.memory_mb))
            free.add_metric(values, max(0.0, total - readings["memory_used_mb"]))
    return [util, used, free, allocated]


def _job_families(now: datetime) -> Iterable[Metric]:
    from portal.core.metrics import metrics_latest

    counts = dict(Job.objects.order_by().values_list("state").annotate(n=Count("id")))
    jobs = GaugeMetricFamily("cosched_jobs", "Jobs by state", labels=["state"])
    for state in JobState:
        jobs.add_metric([state.value.lower()], float(counts.get(state.value, 0)))

    pending = list(
        Job.objects.filter(state=JobState.PENDING).values_list("submitted_at", flat=True)
    )
    waits = [max(0.0, (now - at).total_seconds()) for at in pending]
    queue = GaugeMetricFamily("cosched_queue_length", "Jobs waiting to be placed (PENDING)")
    queue.add_metric([], float(len(pending)))
    oldest = GaugeMetricFamily(
        "cosched_queue_oldest_wait_seconds", "How long the oldest pending job has waited (s)"
    )
    oldest.add_metric([], max(waits, default=0.0))
    mean = GaugeMetricFamily(
        "cosched_queue_mean_wait_seconds", "Mean time the pending jobs have waited so far (s)"
    )
    mean.add_metric([], sum(waits) / len(waits) if waits else 0.0)

    # Queueing delay (submission -> start of the current run) of every job that started, in
    # buckets counted by the database.
    wait = ExpressionWrapper(F("started_at") - F("submitted_at"), output_field=DurationField())
    started = Job.objects.filter(started_at__isnull=False).annotate(wait=wait).order_by()
    aggregates: dict[str, Any] = {"count": Count("id"), "total": Sum("wait")}
    for i, bound in enumerate(WAIT_BUCKETS_S):
        aggregates[f"b{i}"] = Count("id", filter=Q(wait__lte=timedelta(seconds=bound)))
    counted = started.aggregate(**aggregates)
    total_wait = counted["total"].total_seconds() if counted["total"] is not None else 0.0
    buckets = [(_le(b), float(counted[f"b{i}"])) for i, b in enumerate(WAIT_BUCKETS_S)]
    buckets.append(("+Inf", float(counted["count"])))
    job_wait = HistogramMetricFamily(
        "cosched_job_wait_seconds", "Queueing delay of started jobs, submission to start (s)"
    )
    job_wait.add_metric([], buckets, sum_value=total_wait)

    placed = list(
        Job.objects.filter(state__in=[JobState.RUNNING, JobState.PAUSED])
        .select_related("owner")
        .order_by("id")
    )
    latest = metrics_latest(job_ids=[j.pk for j in placed])["jobs"] if placed else {}
    slowdown = GaugeMetricFamily(
        "cosched_job_slowdown",
        "Live Slow-Down of each running or paused job (ALGORITHMS.md §5; 1 = as fast as alone)",
        labels=["job_id", "name", "user", "state"],
    )
    known: list[float] = []
    for j in placed:
        reading = latest.get(j.pk, {}).get("slowdown")
        if reading is None:
            continue
        known.append(reading["value"])
        slowdown.add_metric(
            [str(j.pk), j.name, j.owner.get_username(), j.state.lower()], reading["value"]
        )
    spread = GaugeMetricFamily(
        "cosched_slowdown_max_diff",
        "SD_max_diff: largest minus smallest live Slow-Down over running jobs (ALGORITHMS.md §5)",
    )
    spread.add_metric([], max(known) - min(known) if len(known) > 1 else 0.0)
    return [jobs, queue, oldest, mean, job_wait, slowdown, spread, *_job_gpu_families(placed)]


JOB_GPU_FRESH_S = 300.0  # a job's GPU series shows its readings of the last five minutes


def _job_gpu_families(placed: list[Job]) -> list[Metric]:
    """The newest GPU reading of each running or paused job's current attempt, per GPU."""
    memory = GaugeMetricFamily(
        "cosched_job_gpu_memory_mb",
        "GPU memory held by a job's own processes on one GPU (MB, NVML per-process)",
        labels=["job_id", "user", "node", "gpu"],
    )
    util = GaugeMetricFamily(
        "cosched_job_gpu_util_pct",
        "SM utilisation of a job's own processes on one GPU (percent, NVML per-process samples)",
        labels=["job_id", "user", "node", "gpu"],
    )
    if not placed:
        return [memory, util]
    by_id = {j.pk: j for j in placed}
    fresh = GpuReading.objects.filter(
        job_id__in=list(by_id), at__gte=timezone.now() - timedelta(seconds=JOB_GPU_FRESH_S)
    ).select_related("node")
    newest: dict[tuple[int, str, int], GpuReading] = {}
    recent = (
        fresh.order_by("job_id", "node_id", "gpu_index", "-at").distinct(
            "job_id", "node_id", "gpu_index"
        )
        if connection.vendor == "postgresql"
        else fresh.order_by("at")
    )
    for r in recent:
        key = (r.job_id, r.node.name if r.node else "", r.gpu_index)
        if key not in newest or r.at >= newest[key].at:
            newest[key] = r
    for (job_id, node, gpu), r in sorted(newest.items()):
        labels = [str(job_id), by_id[job_id].owner.get_username(), node, str(gpu)]
        if r.memory_mb is not None:
            memory.add_metric(labels, r.memory_mb)
        if r.util_pct is not None:
            util.add_metric(labels, r.util_pct)
    return [memory, util]


def _node_families(now: datetime) -> Iterable[Metric]:
    nodes = list(Node.objects.order_by("name"))
    up = GaugeMetricFamily(
        "cosched_node_up", "1 if the node is UP (schedulable), else 0", labels=["node", "status"]
    )
    age = GaugeMetricFamily(
        "cosched_node_heartbeat_age_seconds",
        "Seconds since the node's agent last synced (nodes that never synced are absent)",
        labels=["node"],
    )
    last = GaugeMetricFamily(
        "cosched_node_last_heartbeat_timestamp_seconds",
        "When the node's agent last synced (Unix time)",
        labels=["node"],
    )
    lease = GaugeMetricFamily(
        "cosched_node_lease_remaining_seconds",
        "Seconds left on the node's lease (negative: run out)",
        labels=["node"],
    )
    for n in nodes:
        up.add_metric([n.name, n.status], 1.0 if n.status == Node.Status.UP else 0.0)
        if n.last_heartbeat is not None:
            age.add_metric([n.name], max(0.0, (now - n.last_heartbeat).total_seconds()))
            last.add_metric([n.name], n.last_heartbeat.timestamp())
        if n.lease_expires_at is not None:
            lease.add_metric([n.name], (n.lease_expires_at - now).total_seconds())
    return [up, age, last, lease]


# --- the view ---------------------------------------------------------------------------------


def exposition(now: datetime | None = None) -> bytes:
    """The metrics in Prometheus' text format, read now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoschedCollector(now))
    return generate_latest(registry)


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    raw = settings.COSCHED.get("METRICS_ALLOWED_NETWORKS", DEFAULT_ALLOWED_NETWORKS)
    return [ipaddress.ip_network(text, strict=False) for text in raw]


def _from_allowed_address(request: HttpRequest) -> bool:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in net for net in _allowed_networks())


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the right bearer token, or an allowed address (module docstring)."""
    expected = settings.COSCHED.get("METRICS_TOKEN") or ""
    given = _bearer(request)
    if given is not None:
        if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            response = HttpResponse("wrong metrics token\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    elif not _from_allowed_address(request):
        response = HttpResponse(
            "metrics need a bearer token (COSCHED_METRICS_TOKEN) or an address in "
            "COSCHED_METRICS_ALLOWED_NETWORKS\n",
            status=403 if not expected else 401,
            content_type="text/plain",
        )
        if expected:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
