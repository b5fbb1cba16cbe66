"""Where a feature joins a change the kernel makes, inside the change's own transaction (Django
signals, sent with ``send``: a receiver's error rolls the change back). A feature connects its
receivers from its app's ``ready()``; the kernel imports no feature.

- ``approval_opened(workflow=, wait=, now=)``: an approval wait opened; the caller holds the
  workflow's row lock. The notifications feature schedules the approvers' notice here, so a crash
  cannot open the wait without it.
"""
from __future__ import annotations

from django.dispatch import Signal

approval_opened = Signal()
