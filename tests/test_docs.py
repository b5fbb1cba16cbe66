"""The documentation matches the code it describes."""
from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("model", ["Workflow", "Wait", "Commitment", "Activity", "ActivityAttempt"])
def test_state_machine_graphs_in_the_docs_match_the_transitions(model: str) -> None:
    """docs/state-machines.md shows every transition the model declares (line order aside)."""
    out = StringIO()
    call_command("graph_transitions", f"workflows.{model}", stdout=out)
    page = (DOCS / "state-machines.md").read_text()
    block = re.search(rf"## {model}\n\n```dot\n(.*?)```", page, re.S)
    assert block is not None, f"docs/state-machines.md has no section for {model}; run `make docs`"
    assert sorted(block.group(1).split("\n")) == sorted(out.getvalue().split("\n")), "run `make docs`"


@pytest.mark.parametrize("model", ["Activity", "ActivityAttempt"])
def test_the_lifecycle_tables_in_the_docs_match_the_transitions(model: str) -> None:
    """docs/state-machines.md lists each declared transition of the lifecycle's models, as declared."""
    from workflows.services.lifecycle import docs_section

    page = (DOCS / "state-machines.md").read_text()
    assert f"## {model}\n\n```dot\n" in page
    section = page.split(f"## {model}\n\n```dot\n", 1)[1].split("```\n", 1)[1].split("\n## ", 1)[0]
    assert section == docs_section(model), "run `make docs`"
