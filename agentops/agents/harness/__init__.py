"""The ``harness`` kind: a coding agent that finishes a feature list across many sessions, graded by the engine.

Importing the package registers its definition and activities (docs/harness.md) and the scripted
provider's offline sessions (``script``).
"""
from agentops.agents import reviewer  # noqa: F401  (the reviewer children of the `reviewer` option)
from agentops.agents.harness import activities, definition, proposals, script, session  # noqa: F401
