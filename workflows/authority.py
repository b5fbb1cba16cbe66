"""Who may decide an approval wait: the one rule the approval service checks under lock, the admin
uses to show buttons, the API to answer 403 and the notifications to choose whom to tell."""
from __future__ import annotations

from typing import Any

from django.conf import settings

from workflows.models import Intent, Wait


def wait_authority_refusal(*, wait: Wait, user: Any, groups: set[str] | None = None) -> str:
    """Why ``user`` may not decide ``wait`` at all (role, self-approval), or "" when they may.

    Self-approval is deciding on a candidate built for your own goal: as the workflow's
    launcher, or as the author of the intent version the wait was opened under (an operator
    who changed the goal). The approval service checks this under lock; the admin uses it to
    hide buttons and answer a forged POST with 403. ``groups`` saves a query per wait in a
    list, and so does an ``intent_created_by_id`` annotation on the wait (``open_approvals``).
    """
    if not settings.AGENTOPS_ALLOW_SELF_APPROVAL and user.pk is not None:
        if wait.workflow.launched_by_id == user.pk:
            return (f"{user.username} launched workflow {wait.workflow_id} and may not decide its approvals "
                    "(AGENTOPS_ALLOW_SELF_APPROVAL is off); another approver must decide.")
        if _intent_author_id(wait) == user.pk:
            return (f"{user.username} set the goal of workflow {wait.workflow_id} (intent v{wait.intent_version}) "
                    f"that wait {wait.pk} was opened for, and may not decide its approvals "
                    "(AGENTOPS_ALLOW_SELF_APPROVAL is off); another approver must decide.")
    if groups is None:
        groups = set(user.groups.values_list("name", flat=True))
    if not (user.is_superuser or wait.required_role in groups):
        return (f"Wait {wait.pk} needs a member of group {wait.required_role!r}, and {user.username} is not one; "
                "ask an administrator to add them, or ask a member of that group to decide.")
    return ""


def _intent_author_id(wait: Wait) -> int | None:
    """Who created the intent version ``wait`` was opened under (None: nobody recorded)."""
    if "intent_created_by_id" in wait.__dict__:
        author: int | None = wait.__dict__["intent_created_by_id"]
        return author
    return (Intent.objects.filter(workflow_id=wait.workflow_id, version=wait.intent_version)
            .values_list("created_by_id", flat=True).first())
