"""A network of one session: a namespace with loopback only, shared by its services and commands.

A harness session's dev server must be reachable by the session's own commands (``curl
localhost:$PORT``) and by the engine's readiness probe, and by nothing else; and it must reach
nothing of the host (PostgreSQL, Redis, the deploy target, the metadata of the machine). So the
session gets a network namespace of its own, held open by an engine-owned ``bwrap
--unshare-net`` process (bubblewrap brings its loopback up); services and commands join it with
``nsenter --net`` before their own bubblewrap (a worker that is not root joins the holder's user
namespace too, which it owns), and the engine probes a port from inside it. The
holder dies with the worker (``--die-with-parent``) and is stopped when the session closes; with
it goes the namespace.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from workflows.errors import Permanent

PROBE = ("import socket, sys\n"
         "s = socket.socket(); s.settimeout(1)\n"
         "sys.exit(0 if s.connect_ex(('127.0.0.1', int(sys.argv[1]))) == 0 else 1)\n")


class NetworkUnavailable(Permanent):
    """This worker cannot make a session network (no bubblewrap or nsenter, or no privilege to join)."""


@dataclass
class Network:
    """One session's network namespace, held by ``holder`` (the process whose namespace it is: ``pid``)."""

    holder: subprocess.Popen[bytes]
    pid: int
    # Set when bubblewrap made a user namespace for the holder (a worker that is not root): the
    # network is that namespace's, and joining it means joining the user namespace first, which
    # its owner (this worker's user) may.
    user_namespace: bool = False

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def enter(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this network (before any sandbox of its own)."""
        user = [f"--user=/proc/{self.pid}/ns/user", "--preserve-credentials"] if self.user_namespace else []
        return ["nsenter", *user, f"--net={self.path}", "--", *argv]

    def listening(self, port: int) -> bool:
        """Whether something in this network accepts connections on 127.0.0.1:``port``."""
        done = subprocess.run(self.enter([sys.executable, "-c", PROBE, str(port)]), capture_output=True,
                              timeout=10, check=False, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        return done.returncode == 0

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait()


def network_create(bwrap: str) -> Network:
    """A new network namespace with loopback up; raises NetworkUnavailable saying why not."""
    if shutil.which("nsenter") is None:
        raise NetworkUnavailable("nsenter is not installed on this worker (apt-get install util-linux)")
    read, write = os.pipe()
    try:
        holder = subprocess.Popen(
            [bwrap, "--ro-bind", "/", "/", "--unshare-net", "--die-with-parent", "--info-fd", str(write),
             "--", "sleep", "infinity"], pass_fds=(write,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, start_new_session=True)
        os.close(write)
        write = -1
        with os.fdopen(read, "rb") as info:
            read = -1
            raw = info.read()
    finally:
        for fd in (read, write):
            if fd >= 0:
                os.close(fd)
    try:
        pid = int(json.loads(raw)["child-pid"])
    except (ValueError, KeyError, TypeError):
        holder.kill()
        _, err = holder.communicate()
        raise NetworkUnavailable(f"bubblewrap could not make a network namespace: "
                                 f"{err.decode(errors='replace').strip()[:300]}") from None
    try:
        own = os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")
    except OSError:
        own = False
    network = Network(holder=holder, pid=pid, user_namespace=own)
    check = subprocess.run(network.enter(["true"]), capture_output=True, text=True, timeout=10, check=False)
    if check.returncode != 0:
        network.close()
        raise NetworkUnavailable(f"nsenter cannot join a session network here: {check.stderr.strip()[:300]}")
    return network
