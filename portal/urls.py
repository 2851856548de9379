"""URL map: the browser pages (portal.front), the REST API (portal.api, portal.ml), the admin."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("portal.ml.urls")),
    path("api/", include("portal.api.urls")),
    path("", include("portal.front.urls")),
]
