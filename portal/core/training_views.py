"""The training SDK's endpoint (``workers.sdk``): ``POST /api/v1/training/report/``.

Authenticated by the attempt's job token (``Authorization: Bearer cjt_...``, from the job's
``COSCHED_JOB_TOKEN``), never by a user's session or API token. JSON errors: 400 with one
message per bad field (``{"errors": {field: message}}``, nothing written), 401 a missing,
malformed or forged token, 403 the token of an attempt that is no longer running, 413 a body
over 64 KB, 429 (with ``Retry-After``) past ``COSCHED_THROTTLE_JOB`` requests of one attempt
(default 1200 a minute, over both SDK endpoints). See ``portal.core.training``.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework.throttling import SimpleRateThrottle

from portal.core.cache import CHECKED_CACHE
from portal.core.models import Placement
from portal.core.training import ReportError, TokenError, job_token_placement, training_report

MAX_REPORT_BYTES = 64 * 1024


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"detail": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


class JobAttemptThrottle(SimpleRateThrottle):
    """``DEFAULT_THROTTLE_RATES["job"]`` per running attempt: a job (or a runaway loop in it)
    cannot flood the portal through the training endpoints; DRF's throttle machinery on the
    shared cache, used from these plain views."""

    scope = "job"
    cache = CHECKED_CACHE  # a history someone wrote into Redis reads as none, never a 500

    def __init__(self, placement_id: int) -> None:
        self.placement_id = placement_id
        super().__init__()

    def get_rate(self) -> str | None:
        from rest_framework.settings import api_settings  # read now: settings may change

        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": f"attempt-{self.placement_id}"}


def read_job_request(
    request: HttpRequest, max_bytes: int, noun: str
) -> tuple[Placement, object] | JsonResponse:
    """The running attempt a job-token request speaks for and its parsed JSON body (None if
    the body is not JSON), or the error response to send: 401 without a bearer token, 413 over
    ``max_bytes`` ("a ``noun`` is at most ..."), 401/403 for a forged or ended attempt's token.
    Shared by the training SDK's endpoints."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return _error(401, "give the job's token: Authorization: Bearer <COSCHED_JOB_TOKEN>")
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return _error(400, "bad Content-Length")
    if length > max_bytes:
        return _error(413, f"a {noun} is at most {max_bytes} bytes")
    try:
        placement = job_token_placement(key.strip())
    except TokenError as exc:
        return _error(exc.status, str(exc))
    throttle = JobAttemptThrottle(placement.pk)
    if not throttle.allow_request(request, None):
        wait = throttle.wait() or 1.0
        response = _error(429, f"too many requests from this attempt; retry in {wait:.0f} s")
        response["Retry-After"] = str(max(1, int(wait + 0.999)))
        return response
    try:
        data = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        data = None
    return placement, data


@csrf_exempt
@require_POST
def report(request: HttpRequest) -> HttpResponse:
    read = read_job_request(request, MAX_REPORT_BYTES, "report")
    if isinstance(read, JsonResponse):
        return read
    placement, data = read
    if data is None:
        return JsonResponse({"errors": {"body": "expected a JSON object"}}, status=400)
    try:
        reply = training_report(placement, data)
    except ReportError as exc:
        return JsonResponse({"errors": exc.errors}, status=400)
    return JsonResponse(reply)
