"""The ``release`` kind: an approval-gated change, deployed once, verified and reconciled.

Importing the package registers its definition and activities.
"""
from agentops.agents.release import activities, definition  # noqa: F401
