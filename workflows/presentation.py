"""What a kind may add to the pages and commands that show its workflows.

A definition's presentation hooks (``describe_candidate``, ``admin_panels``, ``show_extras``)
return these plain values; the admin and ``manage.py agent show`` render them without knowing
the kind. Hooks only read; they are never called while a workflow advances.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# The query of a page that asks for nothing (``admin_panels``' default).
EMPTY_QUERY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class CandidateView:
    """A candidate as approvers read it: a title, a summary, whole files, short facts, the rest as JSON."""

    title: str = ""
    summary: str = ""
    files: list[tuple[str, str]] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
    other: str = ""


def candidate_as_json(candidate: Any) -> CandidateView:
    """The view of a candidate a kind does not describe: all of it, as indented JSON."""
    return CandidateView(other=json.dumps(candidate, indent=2, sort_keys=True, default=str))


@dataclass(frozen=True)
class AdminPanel:
    """A section of the admin's workflow page: ``template`` (shipped in the kind's package,
    which is a Django app) rendered with ``context`` under the name ``panel``. A panel of a long
    list pages it itself, from the page's query (``admin_panels(workflow, query)``)."""

    template: str
    context: dict[str, Any] = field(default_factory=dict)
