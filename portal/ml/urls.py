"""``/api/v1/interference/...`` (included under ``/api/`` by portal.urls)."""

from django.urls import path

from portal.ml import api

urlpatterns = [
    path("v1/interference/heatmap/", api.interference_heatmap, name="api-interference-heatmap"),
    path("v1/interference/models/", api.interference_models, name="api-interference-models"),
]
