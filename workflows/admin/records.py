"""Read-only admins for the rows operators look up on their own: activities and behavioral releases."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from workflows.admin.common import ReadOnlyAdmin
from workflows.models import Activity, ActivityAttempt, BehavioralRelease


class AttemptInline(admin.TabularInline):
    model = ActivityAttempt
    extra = 0
    can_delete = False
    fields = ("number", "status", "throttled", "refunded", "retry_after_seconds", "worker", "task_id", "started_at",
              "finished_at", "error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Activity)
class ActivityAdmin(ReadOnlyAdmin):
    list_display = ("id", "workflow_id", "name", "node", "status", "attempt", "max_attempts", "next_attempt_at",
                    "tenant", "slot_waiting_since")
    list_filter = ("status", "name", "kind")
    search_fields = ("=id", "=workflow__id", "operation_id", "=idempotency_key")
    ordering = ("-pk",)
    inlines = (AttemptInline,)


@admin.register(BehavioralRelease)
class BehavioralReleaseAdmin(ReadOnlyAdmin):
    list_display = ("fingerprint_short", "provider", "model", "prompt_version", "created_at")
    ordering = ("-created_at",)

    @admin.display(description="fingerprint")
    def fingerprint_short(self, release: BehavioralRelease) -> str:
        return release.fingerprint[:12]
