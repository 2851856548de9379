"""``GET /api/v1/jobs/<id>/log/full/``: a job's full output as text (docs/job-control.md)."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from portal.api.serializers import ErrorSerializer
from portal.core import selectors
from portal.core.joblogs import job_log_chunks


@extend_schema(
    summary="A job's full log (owner, project members or staff)",
    description=(
        "Everything the job wrote to stdout and stderr, every attempt in order (each begins "
        "with the node's header line), as the node agents streamed it; kept "
        "COSCHED_LOG_RETENTION_DAYS after the job ended. Plain text, as a download."
    ),
    parameters=[OpenApiParameter("attempt", int, description="only this attempt")],
    responses={
        (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR),
        404: ErrorSerializer,
    },
)
@api_view(["GET"])
def job_log_full(request: Request, pk: int) -> StreamingHttpResponse:
    job = selectors.job_for_user(request.user, pk)
    attempt = request.query_params.get("attempt")
    if attempt is not None and (not attempt.isdigit() or not 0 < int(attempt) < 2**31):
        raise ValidationError({"attempt": ["give an attempt number (1, 2, ...)"]})
    pieces = job_log_chunks(job, None if attempt is None else int(attempt))
    response = StreamingHttpResponse(pieces, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.log"'
    return response
