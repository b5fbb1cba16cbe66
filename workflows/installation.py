"""This installation's identity, and the idempotency keys it sends to external systems.

An operation id (``wf-1/SEND.4/i1/0``) is unique within one database only: a second
environment, a restored backup or a test run counts its workflows from 1 again. What goes out
is ``<installation id>/<operation id>~<nonce>``: the installation id is random, made once per
database (migration 0011, or the first process that needs it) and shown by ``agent show``; the
nonce is random, made when the activity is scheduled and stored with it (``Activity.idempotency_key``),
so every attempt sends the same key, and an activity scheduled again after the database was
restored from a backup taken before it (the same workflow id, the same operation id, the same
installation id) sends a key nothing was sent under before.
"""
from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import Any

from django.db import connection, transaction

from workflows import clock
from workflows.models import Installation

# Targets of the deploy protocol accept keys up to this length (agentops.deploytarget.client).
MAX_SENT_KEY_LENGTH = 200
# The installation id of each database this process talked to, read once: it never changes.
_IDS: dict[tuple[str, str], str] = {}


def installation_ensure() -> Installation:
    """The installation's row, created with a new random id if absent."""
    return _installation_get_or_create()[0]


@transaction.atomic
def _installation_get_or_create() -> tuple[Installation, bool]:
    """Idempotent: one row with primary key 1 (check constraint ``installation_singleton``);
    ``get_or_create`` under that key, so of two processes creating it at once one row wins and
    both return it."""
    return Installation.objects.get_or_create(
        id=Installation.SINGLETON, defaults={"installation_id": uuid.uuid4().hex, "created_at": clock.now()})


def installation_id() -> str:
    """This database's installation id (read once per process and database, created if absent)."""
    where = (connection.alias, str(connection.settings_dict.get("NAME", "")))
    found = _IDS.get(where)
    if found is None:
        row, created = _installation_get_or_create()
        found = row.installation_id
        # A row made here is remembered once it was read back: the transaction that made it may
        # still roll back, and the id must be the one the database keeps.
        if not created:
            _IDS[where] = found
    return found


def installation_forget(**_: Any) -> None:
    """Forget the installation ids read so far (a flush or a migration may have replaced the row);
    connected to ``post_migrate``, which ``migrate`` and ``flush`` send."""
    _IDS.clear()


def idempotency_key_for(operation_id: str) -> str:
    """A new key for an activity with ``operation_id``, made when it is scheduled:
    ``<installation id>/<operation id>~<nonce>`` (48 random bits).

    At most MAX_SENT_KEY_LENGTH characters (a longer operation id keeps its head and ends with its
    SHA-256, so the key stays unique).
    """
    suffix = f"~{secrets.token_hex(6)}"
    key = f"{installation_id()}/{operation_id}{suffix}"
    if len(key) <= MAX_SENT_KEY_LENGTH:
        return key
    digest = hashlib.sha256(operation_id.encode()).hexdigest()
    head = MAX_SENT_KEY_LENGTH - len(installation_id()) - 1 - len(digest) - 1 - len(suffix)
    return f"{installation_id()}/{operation_id[:head]}#{digest}{suffix}"
