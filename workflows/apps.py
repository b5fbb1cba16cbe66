"""App config: registers the shipped workflow definitions and activity types at start-up."""
from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "Agent workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentops import activities  # noqa: F401  (registers activity types)
        from workflows import definitions  # noqa: F401  (registers workflow kinds)
