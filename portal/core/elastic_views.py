"""The elastic job's statistics endpoint (issue 17): ``POST /api/v1/training/elastic/``.

The training SDK (``workers.sdk``, ``TrainingClient.report_window``) sends one window of 10
mini-batches: ``workers``, ``batches``, ``seconds``, ``rank_rates`` (one per rank),
``remaining_steps``, optionally ``elapsed_s`` and ``replaced_ranks``. Authenticated like
``/api/v1/training/report/``: the attempt's job token (``Authorization: Bearer cjt_...``); 401
for a missing or forged token, 403 for an attempt that is no longer running. 400 with
``{"errors": {field: [messages]}}`` for a bad window (nothing written). The reply is
``portal.core.elastic.elastic_window_report``'s: ``workers``, ``replace_ranks``,
``local_batch``, ``explanation``.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal.core.elastic import ElasticReportError, elastic_window_report
from portal.core.training_views import read_job_request

MAX_WINDOW_BYTES = 64 * 1024
FIELDS = (
    "workers",
    "batches",
    "seconds",
    "rank_rates",
    "remaining_steps",
    "elapsed_s",
    "replaced_ranks",
)


@csrf_exempt
@require_POST
def window(request: HttpRequest) -> HttpResponse:
    read = read_job_request(request, MAX_WINDOW_BYTES, "window")
    if isinstance(read, JsonResponse):
        return read
    placement, data = read
    if not isinstance(data, dict):
        return JsonResponse({"errors": {"body": ["expected a JSON object"]}}, status=400)
    unknown = sorted(set(data) - set(FIELDS))
    errors = {name: ["unknown field"] for name in unknown}
    missing = [n for n in ("workers", "batches", "seconds") if n not in data]
    errors.update({name: ["required"] for name in missing})
    if errors:
        return JsonResponse({"errors": errors}, status=400)
    values = {name: data[name] for name in FIELDS if name in data}
    values.setdefault("rank_rates", [])
    values.setdefault("remaining_steps", 0.0)
    values.setdefault("replaced_ranks", [])
    if not isinstance(values["replaced_ranks"], list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 4096
        for r in values["replaced_ranks"]
    ):
        return JsonResponse(
            {"errors": {"replaced_ranks": ["must be a list of rank numbers"]}}, status=400
        )
    elapsed = values.get("elapsed_s", 0.0)
    if not isinstance(elapsed, int | float) or isinstance(elapsed, bool) or elapsed < 0:
        return JsonResponse(
            {"errors": {"elapsed_s": ["must be a non-negative number"]}}, status=400
        )
    try:
        reply = elastic_window_report(placement.job, **values)
    except ElasticReportError as exc:
        return JsonResponse({"errors": exc.errors}, status=400)
    return JsonResponse(reply)
