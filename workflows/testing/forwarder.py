"""A TCP forwarder that can be partitioned: what stands between a process and a service it reaches.

``Forwarder`` accepts connections on its listening addresses and pipes each to one target
(threads, one per direction). The network-namespace tests (``tests/process/netns.py``) put
PostgreSQL and the deploy target on each host's link with it; the soak (``bench/soak.py``) gives
every worker and beat its own forwarders to PostgreSQL and Redis and cuts them (``cut``/``heal``).

A cut behaves as a partition does, not as a crash: nothing is refused or reset. Bytes already
in flight in either direction are held, so open connections stall (the sender's writes back up
once the socket buffers fill); a new connection is accepted but not connected to the target, so
the client's handshake completes and then nothing answers. A close on either side is held too.
On ``heal`` everything held is delivered, in order, and held connections are connected. What
breaks is what gives up by itself meanwhile: a socket timeout, a lease, a keepalive.
"""
from __future__ import annotations

import socket
import threading


class Forwarder:
    """Accept TCP connections on ``listen`` addresses and pipe each to ``target``.

    ``port`` 0 lets the OS pick one for the first address (the others get the same; ``port``
    says which). A cut link in a network namespace stops the packets between a host and the
    forwarder, not the forwarder's own connection to the service; ``cut()`` stops them here.
    """

    def __init__(self, listen: list[str], port: int, target: tuple[str, int]) -> None:
        self.target = target
        first = socket.create_server((listen[0], port))
        self.port = int(first.getsockname()[1])
        self.servers = [first, *(socket.create_server((address, self.port)) for address in listen[1:])]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._flowing = threading.Event()
        self._flowing.set()
        # What the cuts caught: transfers (a chunk of bytes, or a close) held in an open connection,
        # and connections accepted during a cut.
        self.stalled = 0
        self.held = 0
        for server in self.servers:
            threading.Thread(target=self._accept, args=(server,), daemon=True,
                             name=f"forward-{self.port}").start()

    @property
    def is_cut(self) -> bool:
        return not self._flowing.is_set()

    def cut(self) -> None:
        """Partition: hold every byte and close in both directions, and every new connection, until ``heal``."""
        self._flowing.clear()

    def heal(self) -> None:
        """Deliver what was held and connect the held connections; a no-op when not cut."""
        self._flowing.set()

    def _gate(self, *, counter: str) -> None:
        if not self._flowing.is_set():
            with self._lock:
                setattr(self, counter, getattr(self, counter) + 1)
            self._flowing.wait()

    def _accept(self, server: socket.socket) -> None:
        while not self._closed:
            try:
                client, _ = server.accept()
            except OSError:
                return
            with self._lock:
                self._open.add(client)
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._gate(counter="held")
        if self._closed:
            self._close(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:  # the service is down: the client sees its connection closed, as it would
            self._close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.add(upstream)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._gate(counter="stalled")
                sink.sendall(data)
        except OSError:
            pass
        # The end of the stream, or a reset, crosses a partition no sooner than bytes do.
        self._gate(counter="stalled")
        self._close(source)
        self._close(sink)

    def _close(self, s: socket.socket) -> None:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
        with self._lock:
            self._open.discard(s)

    def close(self) -> None:
        """Stop listening and close every connection (held ones too)."""
        self._closed = True
        for server in self.servers:
            # Shut down first, to wake the thread blocked in accept(): a close() alone leaves the listening
            # socket open until accept returns, and the next test's forwarder on this address fails to bind.
            self._close(server)
        with self._lock:
            sockets = list(self._open)
        for s in sockets:
            self._close(s)
        self._flowing.set()  # the threads waiting at a cut find their sockets closed and end
