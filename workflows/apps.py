"""App config: imports the agent kinds listed in AGENTOPS_AGENT_MODULES and checks them."""
import importlib
from types import ModuleType

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
            agent_module_import(module)


def agent_module_import(module: str) -> ModuleType:
    """Import a module of AGENTOPS_AGENT_MODULES (or the ``agentops.kinds`` entry points): its kinds
    register. ImproperlyConfigured when it cannot be imported, or when it imports as a namespace
    package (a folder of its name without ``__init__.py``: a project folder named like its package,
    on the path because the process runs in the folder above), which registers nothing."""
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"AGENTOPS_AGENT_MODULES lists {module!r}, which cannot be imported: {exc}. "
            "Fix the name, or install the package on this host."
        ) from exc
    if getattr(imported, "__file__", None) is None:
        where = ", ".join(str(path) for path in getattr(imported, "__path__", []))
        raise ImproperlyConfigured(
            f"AGENTOPS_AGENT_MODULES lists {module!r}, which imported as a namespace package from {where} (a "
            f"folder named {module.split('.')[0]!r} without __init__.py, found before the installed package): "
            "none of its kinds would register. Run the process from another folder, or name the project folder "
            "apart from its package."
        )
    return imported
