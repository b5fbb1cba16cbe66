"""The ``reminder`` kind, the worked example of docs/authoring.md: remind, wait to be paid, remind again.

Importing the package registers its activity and its definition; list it in
AGENTOPS_AGENT_MODULES to run it (``...,examples.reminder``).
"""
from examples.reminder import activities, definition  # noqa: F401
