"""App config: imports the agent kinds listed in AGENTOPS_AGENT_MODULES and checks them."""
import importlib

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "Agent workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate

        from workflows import checks  # noqa: F401  (registers the start-up checks)
        from workflows.connections import watch_for_stale_plans
        from workflows.installation import installation_forget

        # A flush (the tests' transactional cases) or a migration may replace the installation's row.
        post_migrate.connect(installation_forget, sender=self, dispatch_uid="workflows.installation_forget")
        # A statement prepared before a migration changed a column it returns is prepared again.
        connection_created.connect(watch_for_stale_plans, dispatch_uid="workflows.watch_for_stale_plans")

        for module in settings.AGENTOPS_AGENT_MODULES:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"AGENTOPS_AGENT_MODULES lists {module!r}, which cannot be imported: {exc}. "
                    "Fix the name, or install the package on this host."
                ) from exc
