"""The reviewer kind: reviews one accepted feature's diff against the feature's steps (a child of the harness)."""
from agentops.agents.reviewer import definition  # noqa: F401  (importing the package registers the kind)
