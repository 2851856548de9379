"""What the cluster measured of a job (``/api/v1/jobs/{id}/gpu-readings/``,
``/api/v1/jobs/{id}/observations/``): its attempts' GPU readings (memory and SM utilisation of
its own processes, per GPU and moment) and its progress observations (docs/profiles.md,
"Measured on the cluster"). Owner, project members and staff; anyone else gets a 404.
``/api/v1/profiling/`` (staff): the profiling command's runs."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.serializers import ErrorSerializer, ProfileRefField
from portal.core import observations, selectors
from portal.core.profiling import DEFAULT_SCALE, profiling_jobs, profiling_submit

_READING = {
    "attempt": serializers.IntegerField(),
    "node": serializers.CharField(allow_null=True),
    "gpu_index": serializers.IntegerField(),
    "at": serializers.DateTimeField(),
    "memory_mb": serializers.FloatField(allow_null=True),
    "util_pct": serializers.FloatField(allow_null=True),
}
_SUMMARY = {
    "attempt": serializers.IntegerField(),
    "n": serializers.IntegerField(),
    "memory_peak_mb": serializers.FloatField(allow_null=True),
    "memory_mean_mb": serializers.FloatField(allow_null=True),
    "util_mean_pct": serializers.FloatField(allow_null=True),
}


@extend_schema(
    summary="A job's GPU readings: memory and SM utilisation of its own processes per GPU",
    description=(
        "The node agent attributes NVML's per-process memory and utilisation samples to the "
        "job's attempt through its process tree and cgroup; `util_pct` is null where the GPU "
        "keeps no per-process samples. `summary`: per attempt, the peak and mean memory of one "
        "GPU and the mean utilisation."
    ),
    responses={
        200: inline_serializer(
            "GpuReadings",
            {
                "summary": inline_serializer("GpuReadingSummary", _SUMMARY, many=True),
                "readings": inline_serializer("GpuReading", _READING, many=True),
            },
        ),
        404: ErrorSerializer,
    },
)
@api_view(["GET"])
def job_gpu_readings(request: Request, pk: int) -> Response:
    job = selectors.job_for_user(request.user, pk)
    return Response(
        {
            "summary": observations.reading_summary(job),
            "readings": observations.readings_of(job),
        }
    )


@extend_schema(
    summary="A job's progress observations (scheduler.knowledge.Observation, plus the attempt)",
    description=(
        "Windows of the job's own progress on one GPU model, under one sharing mode, beside one "
        "set of co-runner types (`co_runners`, empty: alone), and a `completed` observation when "
        "it completed. `rate` is the fraction of the work done per second of the window."
    ),
    responses={200: OpenApiTypes.OBJECT, 404: ErrorSerializer},
)
@api_view(["GET"])
def job_observations(request: Request, pk: int) -> Response:
    job = selectors.job_for_user(request.user, pk)
    rows = observations.observations_of(job)
    for row in rows:
        row["rate"] = (row["progress_to"] - row["progress_from"]) / row["window_s"]
    return Response({"observations": rows})


class ProfilingRequestSerializer(serializers.Serializer):
    profile = ProfileRefField(
        help_text="the application: an approved profile's id, name or name:version"
    )
    models = serializers.ListField(
        child=serializers.CharField(max_length=40),
        min_length=1,
        max_length=20,
        help_text='GPU models to run it on, e.g. ["H100", "A30"]',
    )
    with_profile = ProfileRefField(
        required=False, allow_null=True, help_text="another application to pair it with"
    )
    command = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=4000,
        help_text="the application's command (default: the emulator of its profile)",
    )
    scale = serializers.FloatField(
        required=False, default=DEFAULT_SCALE, help_text="emulated runs: profile time x this"
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("models"), str):
            data = {**data, "models": [m for m in data["models"].split(",") if m.strip()]}
        return super().to_internal_value(data)


def _draft(profile: Any) -> dict[str, Any] | None:
    from portal.core.models import ApplicationProfile

    draft = (
        ApplicationProfile.objects.filter(
            name=profile.name, status="draft", source=ApplicationProfile.Source.MONITORED
        )
        .prefetch_related("gpu_times")
        .first()
    )
    if draft is None:
        return None
    return {
        "id": draft.pk,
        "version": draft.version,
        "status": draft.status,
        "gpu_time_s": {t.gpu_model: t.time_s for t in draft.gpu_times.all()},
        "gpu_memory_max_mb": draft.gpu_memory_max_mb,
        "gpu_util_pct": draft.gpu_util_pct,
        "sources": draft.sources,
    }


@extend_schema(
    summary="Profile an application on the cluster (staff): short solo and pair runs",
    description=(
        "POST submits short runs of the application as ordinary jobs, one solo run per GPU "
        "model (the job parameter `gpu_model` pins it) and, with `with_profile`, a pair of it "
        "and the other application on each model; what they measure (throughput, memory peak, "
        "utilisation) goes into the profile's measured draft for review. GET lists the "
        "profiling jobs of `?profile=` and its draft."
    ),
    request=ProfilingRequestSerializer,
    responses={
        200: OpenApiTypes.OBJECT,
        201: OpenApiTypes.OBJECT,
        400: OpenApiResponse(
            OpenApiTypes.OBJECT, description="field -> list of messages, every bad field"
        ),
        403: ErrorSerializer,
    },
)
@api_view(["GET", "POST"])
@permission_classes([IsAdminUser])
def profiling(request: Request) -> Response:
    if request.method == "GET":
        ref = ProfileRefField()
        try:
            profile = ref.to_internal_value(request.query_params.get("profile", ""))
        except serializers.ValidationError as exc:
            raise serializers.ValidationError({"profile": exc.detail}) from None
        jobs = profiling_jobs(profile)
        return Response(
            {
                "jobs": [_job_row(j) for j in jobs],
                "draft": _draft(profile),
            }
        )
    body = ProfilingRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    try:
        run, jobs = profiling_submit(
            request.user,
            data["profile"],
            models=data["models"],
            with_profile=data.get("with_profile"),
            command=data.get("command") or None,
            scale=data["scale"],
        )
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.message_dict) from None
    return Response({"run": run, "jobs": [_job_row(j) for j in jobs]}, status=201)


def _job_row(job: Any) -> dict[str, Any]:
    return {
        "id": job.pk,
        "name": job.name,
        "state": job.state,
        "gpu_model": (job.params or {}).get("gpu_model"),
        "run": (job.params or {}).get("profiling"),
    }
