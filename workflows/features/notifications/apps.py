"""The notifications feature as a Django app: at start-up it registers its activity and joins the
kernel's approval waits (``workflows.hooks.approval_opened``)."""
from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "workflows.features.notifications"
    label = "agentops_notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from workflows import hooks
        from workflows.features.notifications.services import approval_opened_notify

        hooks.approval_opened.connect(approval_opened_notify, dispatch_uid="agentops.notifications.approval_opened")
