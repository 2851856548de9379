"""URL map: the browser pages (portal.front), the REST API (portal.api, portal.ml), the admin,
and the node agents' endpoints (portal.core.agent_views)."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from django.views import defaults

from portal.core import agent_views, elastic_views, prometheus, training_views


def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness for container healthchecks and load balancers: 200 once the database answers,
    503 while it does not. No login, nothing about the cluster."""
    from django.db import connection

    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return JsonResponse({"status": "database unavailable"}, status=503)
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("agent/v1/sync", agent_views.sync, name="agent-sync"),
    path("agent/v1/results", agent_views.results, name="agent-results"),
    path("api/v1/training/report/", training_views.report, name="training-report"),
    path("api/v1/training/elastic/", elastic_views.window, name="training-elastic"),
    path("metrics", prometheus.metrics_view, name="metrics"),
    path("replay/", include("portal.replay.urls")),
    path("api/", include("portal.ml.urls")),
    path("api/", include("portal.api.urls")),
    path("", include("portal.front.urls")),
]


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """A JSON 404 under /api/ (a client of the API never gets an HTML page), else the page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": f"no API endpoint at {request.path}"}, status=404)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "the server failed; the error is logged"}, status=500)
    return defaults.server_error(request)
