"""URL configuration: the Django admin is the operators' UI (the site's root leads there); the HTTP API,
with its OpenAPI schema and docs and the signed webhooks, lives under /api/."""
from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from workflows.api.endpoints import api
from workflows.features.costs import metrics

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("metrics", metrics.metrics_view, name="metrics"),
]
