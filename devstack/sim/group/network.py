"""Where the pods of a simulated group live on the network.

A network namespace each where the machine allows it (``ip netns``, root, iproute2): every
pod gets its own namespace with one veth into a bridge of the group's own, so pods reach each
other and the host by address only, as pods on separate nodes do. Elsewhere each pod gets an
address of its own on the loopback interface (127.0.0.2, 127.0.0.3, ...)::

    network = make_network(4)              # "auto": namespaces if possible, else loopback
    network.pods[1].address                # "10.213.7.3", or "127.0.0.3"
    network.pods[1].argv_prefix            # ("ip", "netns", "exec", "devstack-sim-…-1"), or ()
    network.close()                        # namespaces, veths and bridge deleted

``DEVSTACK_SIM_NETWORK=netns`` or ``loopback`` forces one. Anything started in a namespace must
have ended before ``close()``: a namespace lives on while a process is in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from devstack.sim.errors import SimStartupError

KIND_AUTO = "auto"
KIND_NETNS = "netns"
KIND_LOOPBACK = "loopback"
ENV_KIND = "DEVSTACK_SIM_NETWORK"
SUBNET_PREFIX = "10.213"
"""Each group's namespaces share one ``10.213.X.0/24``, the bridge at ``.1``, pod i at
``.(i + 2)``; X is the lowest one no interface of the host uses."""
LOOPBACK_FIRST = 2
"""Pod i's loopback address is ``127.0.0.(i + 2)``: 127.0.0.1 stays the host's."""
_LOCK = Path(tempfile.gettempdir()) / "devstack-sim-netns.lock"
"""Held while a subnet is chosen and claimed, so two groups made at once never share one."""


@dataclass(frozen=True)
class PodPlace:
    """One pod's place on the network."""

    index: int
    address: str
    netns: str | None = None

    @property
    def argv_prefix(self) -> tuple[str, ...]:
        """What runs a command inside this pod's namespace (nothing on loopback)."""
        return ("ip", "netns", "exec", self.netns) if self.netns else ()


@dataclass
class GroupNetwork:
    """The pods' places, and what to delete when the group is gone."""

    kind: str
    pods: list[PodPlace]
    host_address: str
    """Where the host (the tests, a router) is seen from the pods."""
    _links: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Delete the veths, the namespaces, then the bridge; what is gone already is fine."""
        for link in self._links[1:]:
            _ip_quietly("link", "del", link)
        for pod in self.pods:
            if pod.netns:
                _ip_quietly("netns", "del", pod.netns)
        for link in self._links[:1]:
            _ip_quietly("link", "del", link)
        self._links.clear()

    def __enter__(self) -> GroupNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_network(size: int, kind: str = KIND_AUTO) -> GroupNetwork:
    """Places for ``size`` pods: namespaces, loopback addresses, or (``auto``) namespaces
    when the machine allows them."""
    kind = os.environ.get(ENV_KIND, kind) if kind == KIND_AUTO else kind
    if kind == KIND_LOOPBACK:
        return loopback_network(size)
    if kind == KIND_NETNS:
        return netns_network(size)
    if kind != KIND_AUTO:
        raise SimStartupError(f"unknown network kind {kind!r}")
    if netns_usable():
        with contextlib.suppress(SimStartupError):
            return netns_network(size)
    return loopback_network(size)


def loopback_network(size: int) -> GroupNetwork:
    pods = [PodPlace(i, f"127.0.0.{i + LOOPBACK_FIRST}") for i in range(size)]
    return GroupNetwork(KIND_LOOPBACK, pods, host_address="127.0.0.1")


@functools.cache
def netns_usable() -> bool:
    """Root, iproute2, and a namespace can really be made and deleted (a container without
    CAP_SYS_ADMIN, or a sandbox, refuses)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"devstack-sim-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except SimStartupError:
        return False
    _ip_quietly("netns", "del", probe)
    return True


def netns_network(size: int) -> GroupNetwork:
    """A namespace per pod, each with a veth into a bridge of the group's own.

    1. Under a lock, choose a free ``10.213.X.0/24`` and claim it with the bridge at ``.1``.
    2. For each pod: a namespace, a veth pair (``eth0`` inside, the other end on the
       bridge), the pod's address on ``eth0``, and ``lo`` up.
    On a failure, whatever was made is deleted again.
    """
    token = secrets.token_hex(3)
    bridge = f"dsb{token}"
    network = GroupNetwork(KIND_NETNS, [], host_address="", _links=[bridge])
    try:
        with _locked():
            subnet = _free_subnet()
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        network.host_address = f"{subnet}.1"
        for i in range(size):
            netns = f"devstack-sim-{token}-{i}"
            pod = PodPlace(i, f"{subnet}.{i + 2}", netns=netns)
            veth = f"dsv{token}{i}"
            _ip("netns", "add", netns)
            network.pods.append(pod)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
            network._links.append(veth)
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("addr", "add", f"{pod.address}/24", "dev", "eth0", netns=pod.netns)
            _ip("link", "set", "eth0", "up", netns=pod.netns)
            _ip("link", "set", "lo", "up", netns=pod.netns)
    except BaseException:
        network.close()
        raise
    return network


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (for rank 0 on a loopback address, where the
    host's other listeners share the port space)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _free_subnet() -> str:
    used = set(re.findall(rf"\b{re.escape(SUBNET_PREFIX)}\.(\d+)\.", _ip("-o", "-4", "addr")))
    for third in range(1, 255):
        if str(third) not in used:
            return f"{SUBNET_PREFIX}.{third}"
    raise SimStartupError(f"no free {SUBNET_PREFIX}.X.0/24 subnet left")


def _ip(*args: str, netns: str | None = None) -> str:
    argv = ["ip", *(("-n", netns) if netns else ()), *args]
    try:
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        why = getattr(exc, "stderr", "") or str(exc)
        raise SimStartupError(f"`{' '.join(argv)}` failed: {why.strip()}") from exc
    return done.stdout


def _ip_quietly(*args: str) -> None:
    with contextlib.suppress(SimStartupError):
        _ip(*args)
