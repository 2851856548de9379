"""``/api/v1/`` (REST), ``/api/schema/`` (OpenAPI) and ``/api/docs/`` (Swagger UI, served
locally from drf-spectacular-sidecar)."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from portal.api import (  # noqa: F401  (schema registers the auth extension)
    dashboard,
    joblogs,
    measured,
    schema,
    views,
)
from portal.teams import views as teams_views

router = DefaultRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("profiles", views.ProfileViewSet, basename="profile")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")

urlpatterns = [
    path("v1/me/", views.me, name="api-me"),
    path("v1/dashboard/cluster/", dashboard.cluster_overview, name="api-dashboard-cluster"),
    path("v1/dashboard/cluster/series/", dashboard.cluster_series, name="api-cluster-series"),
    path("v1/dashboard/gpus/series/", dashboard.gpus_series, name="api-gpus-series"),
    path("v1/dashboard/jobs/series/", dashboard.jobs_series, name="api-jobs-series"),
    path("v1/dashboard/interference/", dashboard.interference_heatmap, name="api-interference"),
    path("v1/dashboard/queue/", dashboard.queue, name="api-queue"),
    path("v1/gpus/<int:pk>/series/", dashboard.gpu_series, name="api-gpu-series"),
    path("v1/jobs/<int:pk>/series/", dashboard.job_series, name="api-job-series"),
    path("v1/jobs/<int:pk>/log/", dashboard.job_log, name="api-job-log"),
    path("v1/jobs/<int:pk>/log/full/", joblogs.job_log_full, name="api-job-log-full"),
    path("v1/jobs/<int:pk>/gpu-readings/", measured.job_gpu_readings, name="api-job-gpu-readings"),
    path("v1/jobs/<int:pk>/observations/", measured.job_observations, name="api-job-observations"),
    path("v1/profiling/", measured.profiling, name="api-profiling"),
    path("v1/usage/", teams_views.usage, name="api-usage"),
    path("v1/projects/", teams_views.my_projects, name="api-projects"),
    path("v1/", include(router.urls)),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
