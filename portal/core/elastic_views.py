"""The elastic job's statistics endpoint (issue 17): ``POST /api/v1/training/elastic/``.

The training SDK (``workers.sdk``, ``TrainingClient.report_window``) sends one window of 10
mini-batches: ``workers``, ``batches``, ``seconds``, ``rank_rates`` (one per rank),
``remaining_steps``, optionally ``elapsed_s`` and ``checkpointed`` (the job saved its state:
a proposed change may regroup it now). Authenticated like ``/api/v1/training/report/``: the
attempt's job token (``Authorization: Bearer cjt_...``); 401 for a missing or forged token, 403
for an attempt that is no longer running (a regrouped one included). 400 with
``{"errors": {field: [messages]}}`` for a bad window (nothing written). The reply is
``portal.core.elastic.elastic_window_report``'s: ``workers``, ``replace_ranks``,
``local_batch``, ``explanation``, ``regroup``, ``attempt``.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal.core.elastic import ElasticReportError, elastic_window_parse, elastic_window_report
from portal.core.training_views import read_job_request

MAX_WINDOW_BYTES = 64 * 1024


@csrf_exempt
@require_POST
def window(request: HttpRequest) -> HttpResponse:
    read = read_job_request(request, MAX_WINDOW_BYTES, "window")
    if isinstance(read, JsonResponse):
        return read
    placement, data = read
    try:
        reply = elastic_window_report(placement.job, **elastic_window_parse(data))
    except ElasticReportError as exc:
        return JsonResponse({"errors": exc.errors}, status=400)
    return JsonResponse(reply)
