"""Forks: a new workflow that starts from a node visit of another, reusing what it recorded before."""
from workflows.features.forks.services import workflow_fork

__all__ = ["workflow_fork"]
