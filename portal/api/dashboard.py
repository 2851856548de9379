"""Live dashboard endpoints (``/api/v1/dashboard/...``, ``/api/v1/gpus/{id}/series/``,
``/api/v1/jobs/{id}/series/``, ``/api/v1/jobs/{id}/log/``), polled by ``static/js/dashboard.js``
every few seconds and documented in the OpenAPI schema like the rest of the API.

Privacy: a user sees their own jobs and their projects' jobs, staff see all
(``selectors.jobs_visible_to``). On the cluster overview anyone else's job shows as "another
user's job" with no id, name or owner; another user's job series or log is a 404, as everywhere
else in the API.

Series come from ``portal.core.metrics.metrics_series`` (downsampled: never more than
``max_points`` points per series) over a window of ``window_s`` seconds ending now.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Count, Prefetch
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.pagination import StandardPagination
from portal.api.serializers import ErrorSerializer
from portal.core import metrics, selectors
from portal.core.models import Gpu, Job, Node, Placement, PolicySettings
from portal.core.states import PLACED, JobState
from portal.teams.selectors import can_see_job, project_ids_of

DEFAULT_WINDOW_S = 900
MAX_WINDOW_S = 7 * 24 * 3600
DEFAULT_MAX_POINTS = 500
MAX_MAX_POINTS = metrics.DEFAULT_MAX_POINTS
# The bulk job series endpoint plots at most this many jobs (most recently started first).
MAX_JOBS_PLOTTED = 20
LOG_TAIL_BYTES = metrics.LOG_TAIL_CHARS
OTHER_USERS_JOB = "another user's job"
GPU_SERIES_METRICS = ("util_pct", "memory_used_mb", "memory_total_mb")
JOB_SERIES_METRICS = ("slowdown", "progress")
CLUSTER_SERIES_METRICS = metrics.CLUSTER_METRICS
BACKEND_LABELS = {"virtual": "virtual GPU (simulated)", "nvml": "NVML (physical GPUs)"}
# Row and column order of the interference heatmap (ALGORITHMS.md §4 classes).
HEATMAP_CLASSES = ("C", "M", "unknown")
HEATMAP_LABELS = {
    "C": "C (compute-intensive)",
    "M": "M (memory-intensive)",
    "unknown": "class unknown",
}


# -- response shapes ----------------------------------------------------------------------------


class JobRefSerializer(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True, help_text="null for another user's job")
    name = serializers.CharField(help_text=f'"{OTHER_USERS_JOB}" for another user\'s job')
    owner = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()
    state = serializers.CharField()
    sharing_mode = serializers.CharField()
    slowdown = serializers.FloatField(allow_null=True, help_text="latest live Slow-Down SD_i")
    progress = serializers.FloatField(allow_null=True, help_text="0..1")


class GpuLiveSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField()
    model = serializers.CharField()
    memory_mb = serializers.IntegerField(help_text="installed memory, MB")
    sharing_modes = serializers.ListField(child=serializers.CharField())
    current_mode = serializers.CharField(help_text="sharing mode in force")
    util_pct = serializers.FloatField(allow_null=True, help_text="latest utilisation, percent")
    memory_used_mb = serializers.FloatField(allow_null=True, help_text="latest, MB")
    metrics_at = serializers.DateTimeField(allow_null=True, help_text="time of the latest sample")
    jobs = JobRefSerializer(many=True)


class NodeLiveSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField(help_text="gpu or cpu")
    status = serializers.CharField(help_text="up, down or draining")
    backend = serializers.CharField()
    backend_label = serializers.CharField(
        allow_null=True, help_text='GPU nodes: "virtual GPU (simulated)" or NVML'
    )
    cores = serializers.IntegerField()
    memory_mb = serializers.IntegerField()
    last_heartbeat = serializers.DateTimeField(allow_null=True)
    heartbeat_age_s = serializers.FloatField(allow_null=True)
    gpus = GpuLiveSerializer(many=True)
    cpu_jobs = JobRefSerializer(many=True, help_text="jobs placed on the node without a GPU")
    job_count = serializers.IntegerField(help_text="jobs placed on the node (any user)")


class ClusterOverviewSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    queue_length = serializers.IntegerField(help_text="PENDING jobs")
    running_jobs = serializers.IntegerField(help_text="RUNNING jobs")
    paused_jobs = serializers.IntegerField()
    nodes_total = serializers.IntegerField()
    gpus_total = serializers.IntegerField()
    nodes_down = serializers.ListField(child=serializers.CharField(), help_text="node names")
    sd_max_diff = serializers.FloatField(
        allow_null=True, help_text="latest cluster value: max |SD_i - SD_j| over running jobs"
    )
    count = serializers.IntegerField(help_text="nodes matching the filters")
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = NodeLiveSerializer(many=True)


class SeriesSerializer(serializers.Serializer):
    metric = serializers.CharField()
    label = serializers.CharField()
    t = serializers.ListField(child=serializers.DateTimeField(), help_text="sample times")
    v = serializers.ListField(child=serializers.FloatField(), help_text="values")
    points = serializers.IntegerField()


class SeriesSetSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    max_points = serializers.IntegerField(help_text="per series")
    series = SeriesSerializer(many=True)


class JobLogSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    state = serializers.CharField()
    source = serializers.ChoiceField(
        choices=["live", "file", "none"],
        help_text="live: pushed by the node agent; file: the job's log on this host",
    )
    text = serializers.CharField(allow_blank=True, help_text="at most the last 16 KB")


class HeatmapSerializer(serializers.Serializer):
    model = serializers.CharField(help_text="interference model the factors come from")
    source = serializers.CharField()
    classes = serializers.ListField(child=serializers.CharField())
    labels = serializers.ListField(child=serializers.CharField())
    matrix = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField()),
        help_text="matrix[i][j]: slowdown of a class-i job next to one class-j job (MPS-like)",
    )
    running_by_class = serializers.DictField(child=serializers.IntegerField())
    note = serializers.CharField()


# -- query parameters --------------------------------------------------------------------------

WINDOW_PARAM = OpenApiParameter(
    "window_s",
    {"type": "integer", "minimum": 1, "maximum": MAX_WINDOW_S},
    description=f"seconds back from now (default {DEFAULT_WINDOW_S})",
)
MAX_POINTS_PARAM = OpenApiParameter(
    "max_points",
    {"type": "integer", "minimum": 1, "maximum": MAX_MAX_POINTS},
    description=f"points per series, at most (default {DEFAULT_MAX_POINTS}, max {MAX_MAX_POINTS})",
)


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: [f"must be an integer, got {raw!r}"]}) from None
    if not lo <= value <= hi:
        raise ValidationError({name: [f"must be between {lo} and {hi}"]})
    return value


def _metric_params(request: Request, allowed: tuple[str, ...], default: tuple[str, ...]) -> list:
    asked = [m for raw in request.query_params.getlist("metric") for m in raw.split(",") if m]
    bad = sorted(set(asked) - set(allowed))
    if bad:
        raise ValidationError(
            {"metric": [f"unknown {', '.join(bad)}; known: {', '.join(allowed)}"]}
        )
    return asked or list(default)


def _window(request: Request) -> tuple[datetime, datetime, int]:
    window_s = _int_param(request, "window_s", DEFAULT_WINDOW_S, 1, MAX_WINDOW_S)
    max_points = _int_param(request, "max_points", DEFAULT_MAX_POINTS, 1, MAX_MAX_POINTS)
    until = timezone.now()
    return until - timedelta(seconds=window_s), until, max_points


def _series(metric: str, label: str, points: list[tuple[datetime, float]]) -> dict[str, Any]:
    return {
        "metric": metric,
        "label": label,
        "t": [at for at, _v in points],
        "v": [v for _at, v in points],
        "points": len(points),
    }


def _series_set(since: datetime, until: datetime, max_points: int, series: list) -> Response:
    body = {"since": since, "until": until, "max_points": max_points, "series": series}
    return Response(SeriesSetSerializer(body).data)


# -- cluster overview ---------------------------------------------------------------------------


def _job_ref(
    placement: Placement, user: Any, latest: dict[int, dict], project_ids: set[int]
) -> dict[str, Any]:
    job = placement.job
    visible = can_see_job(user, job, project_ids)
    live = latest.get(job.pk, {}) if visible else {}
    return {
        "id": job.pk if visible else None,
        "name": job.name if visible else OTHER_USERS_JOB,
        "owner": job.owner.get_username() if visible else None,
        "mine": job.owner_id == user.pk,
        "state": job.state,
        "sharing_mode": placement.sharing_mode,
        "slowdown": live.get("slowdown", {}).get("value"),
        "progress": live.get("progress", {}).get("value"),
    }


def overview_nodes(nodes: list[Node], user: Any, now: datetime) -> list[dict[str, Any]]:
    """Live view of ``nodes`` (GPUs prefetched) for ``user``: per GPU the latest utilisation and
    memory and the jobs placed on it, per node its CPU jobs; the privacy rule applied. Shared by
    the overview endpoint and the cluster page's first render."""
    node_ids = [n.pk for n in nodes]
    placements = list(
        Placement.objects.filter(active=True, node_id__in=node_ids, job__state__in=list(PLACED))
        .select_related("job__owner")
        .prefetch_related("gpus")
        .order_by("job_id")
    )
    gpu_ids = [g.pk for n in nodes for g in n.gpus.all()]
    project_ids = project_ids_of(user)
    visible_job_ids = [p.job_id for p in placements if can_see_job(user, p.job, project_ids)]
    latest = metrics.metrics_latest(gpu_ids=gpu_ids, job_ids=visible_job_ids)
    by_gpu: dict[int, list[dict]] = {}
    by_node_cpu: dict[int, list[dict]] = {}
    job_count: dict[int, int] = {}
    for p in placements:
        job_count[p.node_id] = job_count.get(p.node_id, 0) + 1
        ref = _job_ref(p, user, latest["jobs"], project_ids)
        gpus = p.gpus.all()
        for gpu in gpus:
            by_gpu.setdefault(gpu.pk, []).append(ref)
        if not gpus:
            by_node_cpu.setdefault(p.node_id, []).append(ref)

    out = []
    for node in nodes:
        gpus = []
        for gpu in node.gpus.all():
            live = latest["gpus"].get(gpu.pk, {})
            times = [m["at"] for m in live.values()]
            gpus.append(
                {
                    "id": gpu.pk,
                    "index": gpu.index,
                    "model": gpu.model,
                    "memory_mb": gpu.memory_mb,
                    "sharing_modes": gpu.sharing_modes,
                    "current_mode": gpu.current_mode,
                    "util_pct": live.get("util_pct", {}).get("value"),
                    "memory_used_mb": live.get("memory_used_mb", {}).get("value"),
                    "metrics_at": max(times) if times else None,
                    "jobs": by_gpu.get(gpu.pk, []),
                }
            )
        beat = node.last_heartbeat
        out.append(
            {
                "id": node.pk,
                "name": node.name,
                "kind": node.kind,
                "status": node.status,
                "backend": node.backend,
                "backend_label": (
                    BACKEND_LABELS.get(node.backend, node.backend) if node.kind == "gpu" else None
                ),
                "cores": node.cores,
                "memory_mb": node.memory_mb,
                "last_heartbeat": beat,
                "heartbeat_age_s": (now - beat).total_seconds() if beat else None,
                "gpus": gpus,
                "cpu_jobs": by_node_cpu.get(node.pk, []),
                "job_count": job_count.get(node.pk, 0),
            }
        )
    return out


class OverviewPagination(StandardPagination):
    page_size = 100


@extend_schema(
    summary="Cluster overview: nodes, GPUs with live values and running jobs, queue",
    description=(
        "Nodes (paginated, filterable) with their GPUs, each GPU's latest utilisation and "
        "memory, and the jobs placed on it. Another user's job appears as "
        f'"{OTHER_USERS_JOB}" without id, name or owner (staff see all).'
    ),
    parameters=[
        OpenApiParameter("status", str, enum=["up", "down", "draining"]),
        OpenApiParameter("kind", str, enum=["gpu", "cpu"]),
        OpenApiParameter("page", {"type": "integer", "minimum": 1}),
        OpenApiParameter(
            "page_size",
            {"type": "integer", "minimum": 1, "maximum": 500},
            description="nodes per page (default 100, max 500)",
        ),
    ],
    responses={200: ClusterOverviewSerializer, 400: OpenApiResponse(description="bad filter")},
)
@api_view(["GET"])
def cluster_overview(request: Request) -> Response:
    nodes_qs = Node.objects.prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.order_by("index"))
    ).order_by("name")
    for field, choices in (("status", Node.Status.values), ("kind", Node.Kind.values)):
        value = request.query_params.get(field)
        if value:
            if value not in choices:
                raise ValidationError({field: [f"unknown {value!r}; known: {', '.join(choices)}"]})
            nodes_qs = nodes_qs.filter(**{field: value})
    paginator = OverviewPagination()
    page = paginator.paginate_queryset(nodes_qs, request)
    now = timezone.now()
    states = dict(
        Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING, JobState.PAUSED])
        .order_by()
        .values_list("state")
        .annotate(n=Count("id"))
    )
    cluster_latest = metrics.metrics_latest(cluster=True)["cluster"]
    body = {
        "at": now,
        "queue_length": states.get(JobState.PENDING, 0),
        "running_jobs": states.get(JobState.RUNNING, 0),
        "paused_jobs": states.get(JobState.PAUSED, 0),
        "nodes_total": Node.objects.count(),
        "gpus_total": Gpu.objects.count(),
        "nodes_down": list(
            Node.objects.filter(status=Node.Status.DOWN)
            .order_by("name")
            .values_list("name", flat=True)
        ),
        "sd_max_diff": cluster_latest.get("sd_max_diff", {}).get("value"),
        "count": paginator.page.paginator.count,
        "next": paginator.get_next_link(),
        "previous": paginator.get_previous_link(),
        "results": overview_nodes(list(page), request.user, now),
    }
    return Response(ClusterOverviewSerializer(body).data)


# -- series -------------------------------------------------------------------------------------


@extend_schema(
    summary="Cluster series: SD_max_diff, queue length, running jobs, nodes down",
    parameters=[
        OpenApiParameter(
            "metric",
            str,
            many=True,
            enum=list(CLUSTER_SERIES_METRICS),
            description=f"one or more of {', '.join(CLUSTER_SERIES_METRICS)} "
            "(default sd_max_diff and queue_length)",
        ),
        WINDOW_PARAM,
        MAX_POINTS_PARAM,
    ],
    responses={200: SeriesSetSerializer},
)
@api_view(["GET"])
def cluster_series(request: Request) -> Response:
    names = _metric_params(request, CLUSTER_SERIES_METRICS, ("sd_max_diff", "queue_length"))
    since, until, max_points = _window(request)
    series = [
        _series(m, m, metrics.metrics_series(m, since=since, until=until, max_points=max_points))
        for m in names
    ]
    return _series_set(since, until, max_points, series)


@extend_schema(
    summary="GPU series: utilisation and memory of every GPU (or the ones asked for)",
    parameters=[
        OpenApiParameter(
            "metric",
            str,
            enum=list(GPU_SERIES_METRICS),
            description=f"one of {', '.join(GPU_SERIES_METRICS)} (default util_pct)",
        ),
        OpenApiParameter("gpu", int, many=True, description="GPU ids (default: all)"),
        OpenApiParameter("node", str, description="only the GPUs of this node (name)"),
        WINDOW_PARAM,
        MAX_POINTS_PARAM,
    ],
    responses={200: SeriesSetSerializer},
)
@api_view(["GET"])
def gpus_series(request: Request) -> Response:
    (metric,) = _metric_params(request, GPU_SERIES_METRICS, ("util_pct",))[:1]
    since, until, max_points = _window(request)
    gpus = Gpu.objects.select_related("node").order_by("node__name", "index")
    ids = request.query_params.getlist("gpu")
    if ids:
        try:
            gpus = gpus.filter(pk__in=[int(i) for i in ids])
        except ValueError:
            raise ValidationError({"gpu": ["GPU ids are integers"]}) from None
    if request.query_params.get("node"):
        gpus = gpus.filter(node__name=request.query_params["node"])
    series = [
        _series(
            metric,
            f"{gpu.node.name}/{gpu.index} {gpu.model}",
            metrics.metrics_series(
                metric, gpu_id=gpu.pk, since=since, until=until, max_points=max_points
            ),
        )
        for gpu in gpus[: StandardPagination.max_page_size]
    ]
    return _series_set(since, until, max_points, series)


@extend_schema(
    summary="One GPU's utilisation and memory over time",
    parameters=[
        OpenApiParameter(
            "metric",
            str,
            many=True,
            enum=list(GPU_SERIES_METRICS),
            description=f"{', '.join(GPU_SERIES_METRICS)} (default util_pct, memory_used_mb)",
        ),
        WINDOW_PARAM,
        MAX_POINTS_PARAM,
    ],
    responses={200: SeriesSetSerializer, 404: ErrorSerializer},
)
@api_view(["GET"])
def gpu_series(request: Request, pk: int) -> Response:
    gpu = Gpu.objects.select_related("node").filter(pk=pk).first()
    if gpu is None:
        return Response({"detail": f"GPU {pk} not found"}, status=404)
    names = _metric_params(request, GPU_SERIES_METRICS, ("util_pct", "memory_used_mb"))
    since, until, max_points = _window(request)
    series = [
        _series(
            m,
            f"{gpu.node.name}/{gpu.index} {m}",
            metrics.metrics_series(
                m, gpu_id=gpu.pk, since=since, until=until, max_points=max_points
            ),
        )
        for m in names
    ]
    return _series_set(since, until, max_points, series)


@extend_schema(
    summary="One job's live Slow-Down and progress over time (owner, project members or staff)",
    parameters=[
        OpenApiParameter(
            "metric",
            str,
            many=True,
            enum=list(JOB_SERIES_METRICS),
            description=f"{', '.join(JOB_SERIES_METRICS)} (default both)",
        ),
        WINDOW_PARAM,
        MAX_POINTS_PARAM,
    ],
    responses={200: SeriesSetSerializer, 404: ErrorSerializer},
)
@api_view(["GET"])
def job_series(request: Request, pk: int) -> Response:
    job = selectors.job_for_user(request.user, pk)
    names = _metric_params(request, JOB_SERIES_METRICS, JOB_SERIES_METRICS)
    since, until, max_points = _window(request)
    series = [
        _series(
            m,
            m,
            metrics.metrics_series(
                m, job_id=job.pk, since=since, until=until, max_points=max_points
            ),
        )
        for m in names
    ]
    return _series_set(since, until, max_points, series)


@extend_schema(
    summary="Slow-Down over time of the jobs on the cluster you may see",
    description=(
        "One series per job placed now (SCHEDULED, RUNNING, PAUSED) or finished inside the "
        f"window, your own jobs only (staff: all); at most {MAX_JOBS_PLOTTED} jobs, most "
        "recently started first."
    ),
    parameters=[
        OpenApiParameter(
            "metric",
            str,
            enum=list(JOB_SERIES_METRICS),
            description=f"{', '.join(JOB_SERIES_METRICS)} (default slowdown)",
        ),
        WINDOW_PARAM,
        MAX_POINTS_PARAM,
    ],
    responses={200: SeriesSetSerializer},
)
@api_view(["GET"])
def jobs_series(request: Request) -> Response:
    (metric,) = _metric_params(request, JOB_SERIES_METRICS, ("slowdown",))[:1]
    since, until, max_points = _window(request)
    jobs = (
        selectors.jobs_visible_to(request.user)
        .filter(started_at__isnull=False)
        .exclude(finished_at__lt=since)
        .order_by("-started_at", "-id")[:MAX_JOBS_PLOTTED]
    )
    series = []
    for job in jobs:
        points = metrics.metrics_series(
            metric, job_id=job.pk, since=since, until=until, max_points=max_points
        )
        if points:
            series.append(_series(metric, f"#{job.pk} {job.name}", points))
    return _series_set(since, until, max_points, series)


# -- job log ------------------------------------------------------------------------------------


def job_log_path(job_id: int) -> Path:
    """``<COSCHED_DATA_DIR>/logs/job-<id>.log``, where the node agent writes the job's output."""
    data_dir = getattr(settings, "COSCHED_DATA_DIR", None) or settings.DATA_DIR
    return Path(data_dir) / "logs" / f"job-{job_id}.log"


@extend_schema(
    summary="The tail of a job's log (owner, project members or staff)",
    description=(
        "The last 16 KB of the job's stdout and stderr: as last pushed by the node agent, or "
        "read from the job's log file when this host has it."
    ),
    responses={200: JobLogSerializer, 404: ErrorSerializer},
)
@api_view(["GET"])
def job_log(request: Request, pk: int) -> Response:
    from workers.launcher import tail

    job = selectors.job_for_user(request.user, pk)
    text = metrics.log_tail_get(job.pk)
    source = "live"
    if text is None:
        path = job_log_path(job.pk)
        source = "file" if path.exists() else "none"
        text = tail(path, max_bytes=LOG_TAIL_BYTES) if source == "file" else ""
    body = {"job": job.pk, "state": job.state, "source": source, "text": text}
    return Response(JobLogSerializer(body).data)


# -- interference heatmap -----------------------------------------------------------------------


@extend_schema(
    summary="Interference heatmap between job classes",
    description=(
        "Predicted slowdown of a job of one class next to one co-runner of another, from the "
        "class-based interference model (docs: Policies and algorithms; M+M worst, C+C "
        "middle, M+C best), "
        "with the factors of the active policy settings when it configures that model. "
        "A trained model will replace it when one exists."
    ),
    responses={200: HeatmapSerializer},
)
@api_view(["GET"])
def interference_heatmap(request: Request) -> Response:
    from portal.core.adapters import job_to_domain
    from scheduler.interference import ClassBasedInterference

    policy = PolicySettings.objects.filter(active=True).first()
    params = dict(policy.params or {}) if policy else {}
    source = "class_based defaults"
    model_params: dict[str, Any] = {}
    if params.get("interference") == "class_based":
        model_params = dict(params.get("interference_params") or {})
        source = f"policy settings {policy.name!r}"
    model = ClassBasedInterference(**model_params)

    def factor(a: str, b: str) -> float:
        if "unknown" in (a, b):
            return model.unknown
        return model.factors[(a, b)]

    running: dict[str, int] = dict.fromkeys(HEATMAP_CLASSES, 0)
    placed = Job.objects.filter(state__in=list(PLACED), gpus__gt=0).select_related("profile")
    for job in placed.prefetch_related("profile__gpu_times", "profile__memory_steps"):
        cls = model.job_class(job_to_domain(job)) or "unknown"
        running[cls] += 1
    body = {
        "model": model.name,
        "source": source,
        "classes": list(HEATMAP_CLASSES),
        "labels": [HEATMAP_LABELS[c] for c in HEATMAP_CLASSES],
        "matrix": [[factor(a, b) for b in HEATMAP_CLASSES] for a in HEATMAP_CLASSES],
        "running_by_class": running,
        "note": (
            "Concurrent (MPS-like) slowdown of the row's job next to one job of the column's "
            "class; 1.0 is no interference. Under time-slicing each job also gets only its "
            "share of the GPU; MIG instances do not interfere."
        ),
    }
    return Response(HeatmapSerializer(body).data)


# -- the queue ----------------------------------------------------------------------------------


class QueueRowSerializer(serializers.Serializer):
    position = serializers.IntegerField(help_text="1 = next in submission order")
    id = serializers.IntegerField(allow_null=True, help_text="null: another user's job")
    name = serializers.CharField(allow_null=True, help_text="null: another user's job")
    owner = serializers.CharField(allow_null=True, help_text="shown to staff and to the owner")
    project = serializers.CharField(
        allow_null=True, required=False, help_text="shown to staff, the owner and its members"
    )
    mine = serializers.BooleanField()
    gpus = serializers.IntegerField()
    cpus = serializers.IntegerField()
    priority = serializers.IntegerField()
    submitted_at = serializers.DateTimeField()
    waiting_reason = serializers.CharField(help_text="the policy's reason (empty: not yet seen)")


class QueueSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="PENDING jobs in all")
    results = QueueRowSerializer(many=True)


@extend_schema(
    summary="The queue: pending jobs with their waiting reasons",
    description=(
        "PENDING jobs in submission order with the reason the scheduler gave in its last cycle. "
        "Other users' jobs show their resources and reason but not their name or owner "
        "(staff see every job)."
    ),
    parameters=[
        OpenApiParameter(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": 500},
            description="at most this many rows (1..500)",
        )
    ],
    responses={200: QueueSerializer},
)
@api_view(["GET"])
def queue(request: Request) -> Response:
    limit = _int_param(request, "limit", 50, 1, 500)
    rows, total = selectors.queue_for(request.user, limit=limit)
    return Response(QueueSerializer({"count": total, "results": rows}).data)
