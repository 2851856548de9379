"""Usage accounting: ``GET /api/v1/usage/`` (JSON or CSV) and the ``/usage/`` page with plots.

Both report over the jobs the caller may see (their own and their projects'; staff: all), so
a member sees their projects' totals and nobody else's. Logic: ``portal.teams.accounting``.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from portal.core.selectors import jobs_visible_to
from portal.teams.accounting import (
    BY_CHOICES,
    fair_share_of,
    parse_when,
    usage_csv,
    usage_figure,
    usage_records,
    usage_totals,
    window_error,
)

DEFAULT_SINCE = "30d"


class CsvRenderer(BaseRenderer):
    """Lets ``?format=csv`` through DRF's content negotiation; the view writes the CSV itself
    (an error body, e.g. a 400, is rendered as JSON text)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> Any:
        if isinstance(data, str | bytes):
            return data
        return json.dumps(data, default=str)


def _report(user: Any, params: Any) -> dict[str, Any]:
    """The report for query ``params`` (since, until, by); ``ValueError`` per bad field."""
    now = timezone.now()
    errors: dict[str, list[str]] = {}
    by = params.get("by") or "project"
    if by not in BY_CHOICES:
        errors["by"] = [f"must be one of {', '.join(BY_CHOICES)}, got {by!r}"]
    since = until = None
    try:
        since = parse_when(params.get("since") or DEFAULT_SINCE, now)
    except ValueError as exc:
        errors["since"] = [str(exc)]
    else:
        problem = since and window_error(since, now)
        if problem:
            errors["since"] = [problem]
    try:
        until = parse_when(params.get("until"), now)
    except ValueError as exc:
        errors["until"] = [str(exc)]
    if since and until and until <= since:
        errors["until"] = ["must be after since"]
    if errors:
        raise ValidationError(errors)
    records = usage_records(jobs_visible_to(user), since=since, until=until, now=now)
    rows = usage_totals(records, by)
    total = {
        "jobs": len(records),
        "gpu_seconds": sum(r.gpu_seconds for r in records),
        "cpu_seconds": sum(r.cpu_seconds for r in records),
        "wait_seconds": sum(r.wait_seconds for r in records),
        "gpu_seconds_by_model": {
            m: sum(r.gpu_seconds_by_model.get(m, 0.0) for r in records)
            for m in sorted({m for r in records for m in r.gpu_seconds_by_model})
        },
    }
    return {"since": since, "until": until or now, "by": by, "rows": rows, "total": total}


class UsageRowSerializer(serializers.Serializer):
    group = serializers.CharField(help_text="the project, user name or job id")
    jobs = serializers.IntegerField()
    gpu_seconds = serializers.FloatField(help_text="GPU-seconds over every GPU model")
    gpu_seconds_by_model = serializers.DictField(child=serializers.FloatField())
    cpu_seconds = serializers.FloatField(help_text="core-seconds of every attempt's parts")
    wait_seconds = serializers.FloatField(help_text="time queued, summed over the jobs")
    mean_wait_seconds = serializers.FloatField()


class UsageSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    by = serializers.ChoiceField(choices=BY_CHOICES)
    rows = UsageRowSerializer(many=True)
    total = serializers.DictField()


@extend_schema(
    summary="Usage accounting: GPU-seconds by model, CPU-seconds and wait",
    description=(
        "Per project, user or job, over the jobs you may see (yours and your projects'; staff: "
        "all) that were submitted in the window or ran in it; attempts count the part inside "
        "the window. The totals are the sums of the job rows. `format=csv` returns CSV."
    ),
    parameters=[
        OpenApiParameter("since", str, description="7d, 24h, 30m, 2w or an ISO date (default 30d)"),
        OpenApiParameter("until", str, description="same forms (default: now)"),
        OpenApiParameter("by", str, enum=list(BY_CHOICES), description="default project"),
        OpenApiParameter("format", str, enum=["json", "csv"]),
    ],
    responses={200: UsageSerializer, 400: OpenApiResponse(description="field -> messages")},
)
@api_view(["GET"])
@renderer_classes([*api_settings.DEFAULT_RENDERER_CLASSES, CsvRenderer])
def usage(request: Request) -> Response | HttpResponse:
    report = _report(request.user, request.query_params)
    by = report["by"]
    if request.query_params.get("format") == "csv":
        return _csv_response(report)
    rows = [{**row, "group": str(row[by])} for row in report["rows"]]
    return Response(UsageSerializer({**report, "rows": rows}).data)


def _csv_response(report: dict[str, Any]) -> HttpResponse:
    response = HttpResponse(usage_csv(report["rows"], report["by"]), content_type="text/csv")
    stamp = report["since"].strftime("%Y%m%d")
    response["Content-Disposition"] = (
        f'attachment; filename="cosched-usage-{report["by"]}-{stamp}.csv"'
    )
    return response


@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    params = request.GET
    form = {  # what the form shows again: every key the template reads, in every view
        "since_text": params.get("since") or DEFAULT_SINCE,
        "until_text": params.get("until") or "",
        "by": params.get("by") or "project",
        "by_choices": BY_CHOICES,
    }
    try:
        report = _report(request.user, params)
    except ValidationError as exc:
        return render(request, "front/usage.html", {"errors": exc.detail, **form}, status=400)
    if params.get("format") == "csv":
        return _csv_response(report)
    for row in report["rows"]:  # hours for the table
        row["label"] = str(row[report["by"]] or "-")
        row["gpu_hours"] = row["gpu_seconds"] / 3600
        row["cpu_hours"] = row["cpu_seconds"] / 3600
        row["mean_wait_minutes"] = row["mean_wait_seconds"] / 60
        row["hours_by_model"] = [(m, s / 3600) for m, s in row["gpu_seconds_by_model"].items()]
    return render(
        request,
        "front/usage.html",
        {"report": report, "figure": usage_figure(report["rows"], report["by"]), **form},
    )


class ProjectQuotaSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    guaranteed_gpus = serializers.IntegerField()
    borrow_limit_gpus = serializers.IntegerField(allow_null=True, help_text="null: no limit")
    in_use_gpus = serializers.IntegerField(help_text="GPUs of this model its jobs hold now")


class MyProjectSerializer(serializers.Serializer):
    project = serializers.CharField()
    role = serializers.ChoiceField(choices=["member", "manager"])
    is_default = serializers.BooleanField(help_text="your jobs go here unless you name another")
    personal = serializers.BooleanField()
    shares = serializers.FloatField()
    quotas = ProjectQuotaSerializer(many=True)
    my_usage_gpu_hours = serializers.FloatField(help_text="your decayed usage in it")
    project_usage_gpu_hours = serializers.FloatField(help_text="its decayed usage")
    factor = serializers.FloatField(help_text="your fair-share factor in it, 0..1")


@extend_schema(
    summary="Your projects: role, quotas and what they hold now, fair share",
    responses={200: MyProjectSerializer(many=True)},
)
@api_view(["GET"])
def my_projects(request: Request) -> Response:
    rows = fair_share_of(request.user, timezone.now())
    return Response(MyProjectSerializer(rows, many=True).data)
