"""Activity implementations (the execution plane), registered by name on import."""
from agentops.activities import autonomous, release  # noqa: F401
