"""Hosts of their own for process tests: Linux network namespaces joined to this one by veth links.

Each ``Host`` is a namespace with one veth pair per service it reaches (``db``, ``broker``,
``app``), each on its own /30 of 10.231.<tag>.0/24 (the tag comes from this process's pid). The
services listen in the root namespace on the root end of each link: PostgreSQL through a
``Forwarder`` (``workflows/testing/forwarder.py``: the server listens on 127.0.0.1 only, and its
configuration is left alone), Redis bound to those addresses, the deploy target through a
forwarder. Setting a link down cuts the host from that one service: packets are dropped,
connections hang without a reset, as across a real partition; setting it up again heals it.
Traffic goes only to addresses made here.

Needs root (CAP_NET_ADMIN) and ``ip`` (iproute2); ``netns_refusal()`` says why not, for a skip.
``Network`` deletes every namespace it made on the way out, whatever happened.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from types import TracebackType

SERVICES = ("db", "broker", "app")


def ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, "ip", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=15, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")


def netns_refusal() -> str | None:
    """Why this process may not make network namespaces here, or None when it may."""
    probe = f"aoprobe{os.getpid() % 100000}"
    try:
        ip("netns", "add", probe)
    except (OSError, RuntimeError) as exc:
        return f"cannot create a network namespace (ip netns add needs root and iproute2): {exc}"
    try:
        ip("netns", "del", probe)
    except RuntimeError as exc:
        return f"created a network namespace but could not delete it: {exc}"
    return None


@dataclass
class Link:
    """One veth pair: ``root_ip`` on ``root_dev`` here, ``host_ip`` on ``host_dev`` in the host's namespace."""

    service: str
    root_dev: str
    host_dev: str
    root_ip: str
    host_ip: str

    def down(self) -> None:
        ip("link", "set", self.root_dev, "down")

    def up(self) -> None:
        ip("link", "set", self.root_dev, "up")


@dataclass
class Host:
    """A namespace with a link to each service; ``prefix`` runs a command inside it."""

    name: str
    links: dict[str, Link] = field(default_factory=dict)

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def address_of(self, service: str) -> str:
        """Where this host reaches ``service``: the root end of its link."""
        return self.links[service].root_ip

    def cut(self, *services: str) -> None:
        for service in services:
            self.links[service].down()

    def heal(self, *services: str) -> None:
        for service in services:
            self.links[service].up()


class Network:
    """Hosts made on entry, all deleted on exit (deleting a namespace deletes its veth pairs)."""

    def __init__(self, names: tuple[str, ...], *, services: tuple[str, ...] = SERVICES) -> None:
        self.tag = os.getpid() % 250
        self.names, self.services = names, services
        self.hosts: dict[str, Host] = {}

    def _namespace(self, name: str) -> str:
        return f"ao{self.tag}{name}"

    def __enter__(self) -> Network:
        try:
            for i, name in enumerate(self.names):
                self.hosts[name] = self._make(i, name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _make(self, i: int, name: str) -> Host:
        namespace = self._namespace(name)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)  # a crashed run's
        ip("netns", "add", namespace)
        host = Host(name=namespace)
        self.hosts[name] = host  # from here on, close() deletes it
        ip("link", "set", "lo", "up", namespace=namespace)
        for k, service in enumerate(self.services):
            block = (i * len(self.services) + k) * 4
            link = Link(service=service, root_dev=f"ao{self.tag}{name}{service[0]}r",
                        host_dev=f"ao{self.tag}{name}{service[0]}h",
                        root_ip=f"10.231.{self.tag}.{block + 1}", host_ip=f"10.231.{self.tag}.{block + 2}")
            subprocess.run(["ip", "link", "del", link.root_dev], capture_output=True, check=False)
            ip("link", "add", link.root_dev, "type", "veth", "peer", "name", link.host_dev, "netns", namespace)
            ip("addr", "add", f"{link.root_ip}/30", "dev", link.root_dev)
            ip("link", "set", link.root_dev, "up")
            ip("addr", "add", f"{link.host_ip}/30", "dev", link.host_dev, namespace=namespace)
            ip("link", "set", link.host_dev, "up", namespace=namespace)
            host.links[service] = link
        return host

    def addresses(self, service: str) -> list[str]:
        return [h.address_of(service) for h in self.hosts.values()]

    def close(self) -> None:
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True, check=False)
            for link in host.links.values():  # gone with the namespace; make sure
                subprocess.run(["ip", "link", "del", link.root_dev], capture_output=True, check=False)
        self.hosts.clear()

