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
        from workflows import checks  # noqa: F401  (registers the start-up checks)

        for module in settings.AGENTOPS_AGENT_MODULES:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"AGENTOPS_AGENT_MODULES lists {module!r}, which cannot be imported: {exc}. "
                    "Fix the name, or install the package on this host."
                ) from exc
