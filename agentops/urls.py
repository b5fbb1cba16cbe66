"""URL configuration: the Django admin is the operators' UI."""
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
