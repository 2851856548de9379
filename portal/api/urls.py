"""``/api/v1/`` (REST), ``/api/schema/`` (OpenAPI) and ``/api/docs/`` (Swagger UI, served
locally from drf-spectacular-sidecar)."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from portal.api import schema, views  # noqa: F401  (schema registers the auth extension)

router = DefaultRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("profiles", views.ProfileViewSet, basename="profile")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")

urlpatterns = [
    path("v1/me/", views.me, name="api-me"),
    path("v1/", include(router.urls)),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
