"""The ``autonomous`` kind: the days-long agent that plans, executes tasks, verifies and adapts.

Importing the package registers its definition and activities.
"""
from agentops.agents.autonomous import activities, definition  # noqa: F401
