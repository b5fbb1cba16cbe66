"""Activity implementations (the execution plane), registered by name on import."""
from agentops.activities import release  # noqa: F401
