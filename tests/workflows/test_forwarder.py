"""The partitionable forwarder of the test kit (``workflows/testing/forwarder.py``), against an echo server."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from workflows.testing.forwarder import Forwarder

pytestmark = [pytest.mark.timeout(30)]


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")],
                             daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1])
    server.shutdown(socket.SHUT_RDWR)
    server.close()


@pytest.fixture
def forwarder(echo: int) -> Iterator[Forwarder]:
    f = Forwarder(["127.0.0.1"], 0, ("127.0.0.1", echo))
    yield f
    f.close()


def ask(s: socket.socket, data: bytes, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    s.sendall(data)
    return s.recv(4096)


def assert_answered_only_after_the_heal(forwarder: Forwarder, s: socket.socket, data: bytes) -> None:
    with pytest.raises(TimeoutError):
        ask(s, data, timeout=0.5)
    forwarder.heal()
    s.settimeout(5)
    assert s.recv(4096) == data


def test_a_cut_stalls_an_open_connection_without_an_error_and_the_heal_delivers_what_was_held(
        forwarder: Forwarder) -> None:
    with socket.create_connection(("127.0.0.1", forwarder.port)) as s:
        assert ask(s, b"before") == b"before"
        forwarder.cut()
        assert_answered_only_after_the_heal(forwarder, s, b"during")
    assert forwarder.stalled == 1


def test_a_connection_opened_during_a_cut_is_accepted_and_answered_only_after_the_heal(
        forwarder: Forwarder) -> None:
    forwarder.cut()
    with socket.create_connection(("127.0.0.1", forwarder.port), timeout=2) as s:
        assert_answered_only_after_the_heal(forwarder, s, b"hello")
    assert forwarder.held == 1


def test_closing_the_forwarder_closes_the_connections_it_holds(forwarder: Forwarder) -> None:
    forwarder.cut()
    with socket.create_connection(("127.0.0.1", forwarder.port), timeout=2) as s:
        s.settimeout(5)
        s.sendall(b"x")
        forwarder.close()
        # Closed with the held byte unread, the forwarder's side may answer with a reset instead of an end.
        try:
            assert s.recv(4096) == b""
        except ConnectionResetError:
            pass
