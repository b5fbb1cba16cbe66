"""`manage.py agent <verb>`: launch, inspect and steer agents; --json for scripts.

Each family of verbs is a module of ``workflows.management.verbs`` (its parsers and what runs
them). Exit status: 0 on success, 2 on bad input (unknown ids, malformed arguments), 3 when the
request was refused (stale candidate, wrong role, expired wait, workflow in the wrong state).
"""
from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.errors import AgentOpsError, InvalidInput, NotFound, Refused
from workflows.features.access import verbs as access
from workflows.features.schedules import verbs as schedule
from workflows.features.webhooks import verbs as webhook
from workflows.management.verbs import decisions, records, runs
from workflows.management.verbs.common import console_for, numbers_checked

EXIT_BAD_INPUT = 2
EXIT_REFUSED = 3
# In the order `agent --help` lists them.
FAMILIES = (runs, decisions, records, access, schedule, webhook)
RUN = {name: run for family in FAMILIES for name, run in family.RUN.items()}


class Command(BaseCommand):
    help = "Launch, inspect and steer agents. Run `agent <verb> --help` for each verb."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True, parser_class=CommandParser)

        def verb(name: str, help_text: str) -> CommandParser:
            sub = verbs.add_parser(name, help=help_text, description=help_text)
            sub.add_argument("--json", action="store_true", help="print JSON for scripts")
            return sub

        for family in FAMILIES:
            family.add_parsers(verb)

    def handle(self, *args: Any, **options: Any) -> None:
        self.console = console_for(self.stdout)
        try:
            numbers_checked(options)
            RUN[options["verb"]](self, options)
        except (InvalidInput, NotFound) as exc:
            raise CommandError(str(exc), returncode=EXIT_BAD_INPUT) from exc
        except Refused as exc:
            raise CommandError(str(exc), returncode=EXIT_REFUSED) from exc
        except AgentOpsError as exc:
            raise CommandError(str(exc), returncode=1) from exc

    def emit(self, options: dict[str, Any], data: Any, text: str) -> None:
        """The JSON of ``data`` with --json, else ``text`` on the console."""
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
        else:
            self.console.print(text)
