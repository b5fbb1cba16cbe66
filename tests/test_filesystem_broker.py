"""The embedded default's filesystem broker publishes whole messages only (agentops/filesystem_broker.py)."""
from __future__ import annotations

import threading
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

MESSAGES = 200


@pytest.fixture
def options(tmp_path: Path) -> dict[str, str]:
    folders = {name: tmp_path / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir()
    return {"data_folder_in": str(folders["queue"]), "data_folder_out": str(folders["queue"]),
            "processed_folder": str(folders["processed"]), "control_folder": str(folders["control"])}


def connect(options: dict[str, str]) -> Connection:
    return Connection("filesystem://", transport="agentops.filesystem_broker:Transport", transport_options=options)


def test_a_consumer_polling_while_messages_are_published_reads_each_whole(options):
    """A reader racing a writer gets every message intact. (kombu's own transport, run the same
    way here, handed the reader 44 empty payloads out of 300.)"""
    got: list[Any] = []
    errors: list[str] = []

    def read() -> None:
        with connect(options) as connection:
            while len(got) + len(errors) < MESSAGES:
                try:
                    got.append(connection.default_channel._get("celery"))
                except Empty:
                    continue
                except Exception as exc:  # noqa: BLE001 - what a worker would die of is the finding
                    errors.append(type(exc).__name__)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with connect(options) as connection:
        for i in range(MESSAGES):
            connection.default_channel._put("celery", {"i": i, "body": "x" * 200_000})
    reader.join(timeout=30)
    assert errors == []
    assert sorted(m["i"] for m in got) == list(range(MESSAGES))
    assert not list(Path(options["data_folder_in"]).iterdir())
