"""URL map: the browser pages (portal.front), the REST API (portal.api), the admin, and the node
agents' sync endpoint (portal.core.agent_views)."""

from django.contrib import admin
from django.urls import include, path

from portal.core import agent_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("agent/v1/sync", agent_views.sync, name="agent-sync"),
    path("agent/v1/results", agent_views.results, name="agent-results"),
    path("api/", include("portal.api.urls")),
    path("", include("portal.front.urls")),
]
