"""What the cluster measured of a job (``/api/v1/jobs/{id}/gpu-readings/``,
``/api/v1/jobs/{id}/observations/``): its attempts' GPU readings (memory and SM utilisation of
its own processes, per GPU and moment) and its progress observations (docs/profiles.md,
"Measured on the cluster"). Owner, project members and staff; anyone else gets a 404."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.serializers import ErrorSerializer
from portal.core import observations, selectors

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
    responses={200: serializers.JSONField(), 404: ErrorSerializer},
)
@api_view(["GET"])
def job_observations(request: Request, pk: int) -> Response:
    job = selectors.job_for_user(request.user, pk)
    rows = observations.observations_of(job)
    for row in rows:
        row["rate"] = (row["progress_to"] - row["progress_from"]) / row["window_s"]
    return Response({"observations": rows})
