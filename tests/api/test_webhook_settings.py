"""AGENTOPS_WEBHOOK_SECRETS keeps its format; a rotation adds a previous secret per source, checked at start."""
from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS = Path(__file__).resolve().parents[2] / "agentops" / "settings.py"
NEW, OLD = "n" * 32, "o" * 32


def settings_with(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, Any]:
    """agentops/settings.py run afresh under these variables (the rest of the environment as it is)."""
    for name in ("SECRETS", "PREVIOUS_SECRETS", "UNVERSIONED_SOURCES"):
        monkeypatch.delenv(f"AGENTOPS_WEBHOOK_{name}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS))


def test_the_current_format_still_reads_and_nothing_is_rotated_or_unversioned(monkeypatch):
    loaded = settings_with(monkeypatch, AGENTOPS_WEBHOOK_SECRETS=f"ci={NEW}, tickets={OLD}=x")
    assert loaded["AGENTOPS_WEBHOOK_SECRETS"] == {"ci": NEW, "tickets": f"{OLD}=x"}
    assert loaded["AGENTOPS_WEBHOOK_PREVIOUS_SECRETS"] == {}
    assert loaded["AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES"] == frozenset()


def test_a_source_gets_a_previous_secret_and_may_be_listed_as_unversioned(monkeypatch):
    loaded = settings_with(monkeypatch, AGENTOPS_WEBHOOK_SECRETS=f"ci={NEW},tickets={NEW}",
                           AGENTOPS_WEBHOOK_PREVIOUS_SECRETS=f"ci={OLD}",
                           AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES="tickets")
    assert loaded["AGENTOPS_WEBHOOK_PREVIOUS_SECRETS"] == {"ci": OLD}
    assert loaded["AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES"] == frozenset({"tickets"})


@pytest.mark.parametrize(("env", "message"), [
    ({"AGENTOPS_WEBHOOK_SECRETS": f"ci={NEW},ci={OLD}"},
     "names the source 'ci' twice; give each source one secret there, and put the secret being rotated out "
     "in AGENTOPS_WEBHOOK_PREVIOUS_SECRETS"),
    ({"AGENTOPS_WEBHOOK_SECRETS": f"ci={NEW}", "AGENTOPS_WEBHOOK_PREVIOUS_SECRETS": f"tickets={OLD}"},
     "gives the source 'tickets' a previous secret, but AGENTOPS_WEBHOOK_SECRETS has no current one for it"),
    ({"AGENTOPS_WEBHOOK_SECRETS": f"ci={NEW}", "AGENTOPS_WEBHOOK_PREVIOUS_SECRETS": f"ci={NEW}"},
     "it is the same as its current secret"),
    ({"AGENTOPS_WEBHOOK_SECRETS": f"ci={NEW}", "AGENTOPS_WEBHOOK_PREVIOUS_SECRETS": "ci=short"},
     "AGENTOPS_WEBHOOK_PREVIOUS_SECRETS must be source=secret pairs"),
    ({"AGENTOPS_WEBHOOK_SECRETS": f"ci={NEW}", "AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES": "ci,tickets"},
     "AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES names sources without a secret in AGENTOPS_WEBHOOK_SECRETS: tickets."),
])
def test_a_bad_rotation_setting_is_refused_at_start_with_what_to_change(monkeypatch, env, message):
    with pytest.raises(ImproperlyConfigured) as refused:
        settings_with(monkeypatch, **env)
    assert message in str(refused.value)
