"""`manage.py deploy_target`: run the deploy target HTTP server in the foreground until SIGTERM."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.deploytarget.server import FAULT_MODES, Fault, serve


class Command(BaseCommand):
    help = (
        "Run the deploy target the release agent deploys to. Defaults: host 127.0.0.1, the port of "
        "AGENTOPS_DEPLOY_TARGET_URL, state file VAR_DIR/deploy-target.json. Stops on SIGTERM or Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=None,
                            help="port to bind; 0 picks a free one (default: AGENTOPS_DEPLOY_TARGET_URL's port)")
        parser.add_argument("--state", type=Path, default=None,
                            help="JSON state file (default: VAR_DIR/deploy-target.json)")
        parser.add_argument("--fault", choices=FAULT_MODES, default="none", help="fault mode at start")
        parser.add_argument("--fault-count", type=int, default=None,
                            help="requests the fault applies to (default: until changed via POST /_faults)")
        parser.add_argument("--fault-seconds", type=float, default=None, help="delay for --fault slow")

    def handle(self, *args: Any, **options: Any) -> None:
        # Settings are read here, not at import, so test overrides and env changes apply.
        port = options["port"] if options["port"] is not None else _default_port(settings.AGENTOPS_DEPLOY_TARGET_URL)
        state_path = options["state"] or Path(settings.VAR_DIR) / "deploy-target.json"
        try:
            fault = Fault.build(options["fault"], options["fault_count"], options["fault_seconds"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            serve(host=options["host"], port=port, state_path=state_path, fault=fault, announce=self._announce)
        except (OSError, ValueError) as exc:
            raise CommandError(f"deploy target cannot start on {options['host']}:{port}: {exc}") from None

    def _announce(self, line: str) -> None:
        # Flushed so a parent process waiting for this line sees it at once.
        self.stdout.write(line)
        self.stdout.flush()


def _default_port(url: str) -> int:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        return port
    if parts.scheme in ("http", "https"):
        return 443 if parts.scheme == "https" else 80
    raise CommandError(
        f"AGENTOPS_DEPLOY_TARGET_URL={url!r} has no usable port; set it to e.g. http://127.0.0.1:8765 "
        "or pass --port."
    )
