"""Start-up checks (`manage.py check`, and every runserver and worker start): the kinds and activities
registered from AGENTOPS_AGENT_MODULES can run as written."""
from __future__ import annotations

from typing import Any

from django.core import checks

from workflows import registry


@checks.register("agentops")
def check_definitions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every definition has its nodes and handlers (registration already refused the rest), and
    every activity takes (ctx, input) of a supported type and names a registered compensation."""
    messages: list[checks.CheckMessage] = []
    for cls in registry.definitions():
        for problem in registry.definition_problems(cls):
            messages.append(checks.Error(f"Workflow kind {cls.kind!r}: {problem}.", obj=cls, id="agentops.E001"))
    for spec in registry.activity_types():
        for problem in spec.problems():
            messages.append(checks.Error(f"{problem[0].upper()}{problem[1:]}.", obj=spec.fn, id="agentops.E002"))
    if not registry.definitions():
        messages.append(checks.Warning(
            "No workflow kind is registered.", hint="List the packages of your kinds in AGENTOPS_AGENT_MODULES.",
            id="agentops.W001",
        ))
    return messages
