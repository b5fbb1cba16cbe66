"""The ``harness`` kind: a coding agent that finishes a feature list across many sessions, graded by the engine.

Importing the package registers its definition and activities (docs/harness.md).
"""
from agentops.agents import reviewer  # noqa: F401  (the reviewer children of the `reviewer` option)
from agentops.agents.harness import activities, definition, script  # noqa: F401  (script: the offline sessions)
