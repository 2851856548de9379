"""REST endpoints of the interference models (``/api/v1/interference/...``), polled by the cluster
and profile pages (``static/js/dashboard.js``) and documented in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.serializers import ErrorSerializer
from portal.core import selectors as core_selectors
from portal.ml import selectors
from scheduler.catalog import CATALOG


class ValidationScoresSerializer(serializers.Serializer):
    n = serializers.IntegerField(required=False, help_text="held-out samples scored")
    mse = serializers.FloatField(required=False, help_text="of the normalised throughput")
    r2 = serializers.FloatField(required=False)
    mae = serializers.FloatField(required=False)


class ModelBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    algorithm = serializers.CharField()
    active = serializers.BooleanField()
    dataset_hash = serializers.CharField()
    created_at = serializers.DateTimeField()
    live_samples = serializers.IntegerField()
    scores = serializers.DictField(
        child=ValidationScoresSerializer(), help_text="cv5, cv5_pairs, loao -> scores"
    )


class HeatmapCellSerializer(serializers.Serializer):
    row = serializers.IntegerField(help_text="profile id of the job slowed down")
    col = serializers.IntegerField(help_text="profile id of its co-runner")
    predicted = serializers.FloatField(allow_null=True, help_text="predicted slowdown")
    predicted_feasible = serializers.BooleanField(allow_null=True)
    measured = serializers.FloatField(allow_null=True, help_text="mean live slowdown")
    samples = serializers.IntegerField(help_text="live co-run samples behind 'measured'")


class ProfileRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.CharField()


class InterferenceHeatmapSerializer(serializers.Serializer):
    model = ModelBriefSerializer(allow_null=True, help_text="the active model (null: none)")
    gpu_model = serializers.CharField()
    gpu_models = serializers.ListField(child=serializers.CharField())
    profiles = ProfileRefSerializer(many=True)
    labels = serializers.ListField(child=serializers.CharField())
    predicted = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="predicted[i][j]: slowdown of profile i next to profile j",
    )
    predicted_feasible = serializers.ListField(
        child=serializers.ListField(child=serializers.BooleanField(allow_null=True))
    )
    measured = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True))
    )
    samples = serializers.ListField(child=serializers.ListField(child=serializers.IntegerField()))
    cells = HeatmapCellSerializer(many=True)
    measured_pairs = serializers.IntegerField(help_text="pairs with both values")
    mean_abs_error = serializers.FloatField(allow_null=True)
    note = serializers.CharField()


@extend_schema(
    summary="Predicted vs measured interference between the profiles present",
    description=(
        "For the profiles of queued and placed jobs (and of measured co-runs), at most "
        f"{selectors.HEATMAP_MAX_PROFILES}: the active Co-scheML model's predicted slowdown of "
        "each profile next to each other one, and the mean slowdown measured live when two "
        "such jobs shared a GPU alone. With ``profile`` the heatmap includes that profile."
    ),
    parameters=[
        OpenApiParameter("profile", int, description="include this profile (profile page)"),
        OpenApiParameter(
            "gpu_model",
            str,
            enum=sorted(CATALOG),
            description="GPU model (default: the cluster's most common)",
        ),
    ],
    responses={
        200: InterferenceHeatmapSerializer,
        400: OpenApiResponse(description="bad parameter"),
        404: ErrorSerializer,
    },
)
@api_view(["GET"])
def interference_heatmap(request: Request) -> Response:
    include = None
    raw = request.query_params.get("profile")
    if raw not in (None, ""):
        try:
            int(raw)
        except ValueError:
            raise ValidationError({"profile": [f"must be a profile id, got {raw!r}"]}) from None
        include = core_selectors.profile_for_user(request.user, raw)
    gpu_model = request.query_params.get("gpu_model") or None
    if gpu_model is not None:
        from portal.core.adapters import _gpu_model_key

        known = set(selectors.cluster_gpu_models()) | set(CATALOG)
        if _gpu_model_key(gpu_model) not in known:
            raise ValidationError(
                {
                    "gpu_model": [
                        f"unknown GPU model {gpu_model!r}; known: {', '.join(sorted(known))}"
                    ]
                }
            )
        gpu_model = _gpu_model_key(gpu_model)
    visible = set(core_selectors.profiles_visible_to(request.user).values_list("pk", flat=True))
    profiles = selectors.heatmap_profiles(include=include, visible=visible)
    body: dict[str, Any] = selectors.interference_heatmap(profiles, gpu_model)
    return Response(InterferenceHeatmapSerializer(body).data)


@extend_schema(
    summary="Trained interference models (newest first)",
    responses={200: ModelBriefSerializer(many=True)},
)
@api_view(["GET"])
def interference_models(request: Request) -> Response:
    data = [selectors.model_brief(m) for m in selectors.models_list()]
    return Response(ModelBriefSerializer(data, many=True).data)
