"""Workflow definitions shipped with agentops, registered by kind on import."""
from workflows.definitions import release  # noqa: F401
