"""Workflow definitions shipped with agentops, registered by kind on import."""
from workflows.definitions import autonomous, release  # noqa: F401
