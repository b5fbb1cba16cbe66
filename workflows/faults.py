"""Named fault points for failure tests; inert unless AGENTOPS_TESTING_FAULTS is set.

AGENTOPS_TESTING_FAULTS is a JSON list of rules such as
``{"point": "activity.after_external_call", "when": {"activity": "deploy", "attempt": 1},
"action": "sigkill_self"}``. Each firing is appended to AGENTOPS_FAULT_LOG first, so a
test can prove that its fault really happened. The ``crash`` action stops an in-process test at
the point (``Crashed``); the others kill, stop, slow or disconnect the process they fire in.
"""
from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from django.conf import settings


class Crashed(BaseException):
    """Raised by the ``crash`` action: the process stops at the fault point as far as the code around
    it can tell. A BaseException, so no ``except Exception`` records it as an attempt's failure:
    what was committed before the point stays, what was not is rolled back, and a claimed attempt
    keeps its lease until it runs out, as when the process dies there."""


def faultpoint(point: str, **context: Any) -> None:
    raw = settings.AGENTOPS_TESTING_FAULTS
    if not raw:
        return
    for rule in json.loads(raw):
        if rule.get("point") != point:
            continue
        if any(str(context.get(key)) != str(value) for key, value in rule.get("when", {}).items()):
            continue
        _fire(point, rule, context)


def _fire(point: str, rule: dict[str, Any], context: dict[str, Any]) -> None:
    action = rule.get("action", "raise")
    line = json.dumps({"point": point, "action": action, "pid": os.getpid(), "at": time.time(), **context})
    with open(settings.AGENTOPS_FAULT_LOG, "a", encoding="utf-8") as log:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())
    if action == "sigkill_self":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "exit":
        os._exit(137)
    elif action == "sleep":
        time.sleep(float(rule.get("seconds", 1)))
    elif action == "pg_terminate_self":
        from workflows.sql.server import terminate_own_session

        terminate_own_session()
    elif action == "crash":
        raise Crashed(f"crashed at {point}")
    elif action == "raise":
        raise RuntimeError(f"fault injected at {point}")
    else:
        raise ValueError(
            f"unknown fault action {action!r} at {point}; "
            "use sigkill_self, exit, sleep, pg_terminate_self, crash or raise"
        )
