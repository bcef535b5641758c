"""A pod network: pods that reach each other and the node by their own IPs, as a CNI gives them.

The pod tests' podman runs with ``netns = "none"`` (no CNI here): each pod has a network
namespace with its loopback only, which one pod's tests reach through ``relay``. Tests of
several pods that talk to each other (a router on the node, a proxy pod, engine pods whose
coordinators call the router and are called by the proxy) need what a cluster network gives
instead, made here with iproute2 as a bridge CNI plugin makes it:

1. ``ClusterNetwork.open()``: a Linux bridge on the node with the subnet's first address
   (``10.244.N.1/24``, the first N whose address no interface has): the node's address on
   the pod network, where a test's node-side services (a router) listen.
2. ``attach(netns_pid)``: a veth pair per pod, the node's end on the bridge, the pod's end
   moved into the pod's network namespace as ``eth0`` with the next address of the subnet
   and a default route through the bridge. Returns the pod's IP.
3. ``close()``: the bridge removed (each veth pair goes with its pod's namespace).

Services have no DNS here: a pod that names one gets it through ``hostAliases``
(``/etc/hosts``), which the pod runner passes to podman.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
import threading

SUBNETS = ipaddress.IPv4Network("10.244.0.0/16")
"""Where the networks' /24 subnets are taken from (``10.244.0.0/24`` is left to the
single-pod tests' loopback address, ``spec.POD_IP``)."""


def _ip(*args: str, netns_pid: int | None = None) -> str:
    argv = ["ip", *args]
    if netns_pid is not None:
        argv = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


class ClusterNetwork:
    """One /24 pod network on a bridge of the node (see the module's docstring)."""

    def __init__(self) -> None:
        self.bridge = f"pb{secrets.token_hex(4)}"
        self.subnet: ipaddress.IPv4Network | None = None
        self._next = 10
        self._lock = threading.Lock()

    @property
    def node_ip(self) -> str:
        """The node's address on the pod network (the bridge's)."""
        assert self.subnet is not None, "open() first"
        return str(self.subnet.network_address + 1)

    def open(self) -> ClusterNetwork:
        """Step 1."""
        taken = {ipaddress.ip_interface(word).network for line in _ip("-4", "-o", "addr")
                 .splitlines() for word in line.split() if "/" in word and word[0].isdigit()}
        self.subnet = next(s for s in SUBNETS.subnets(new_prefix=24)
                           if s.network_address.packed[2] != 0 and s not in taken)
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.node_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except RuntimeError:
            self.close()
            raise
        return self

    def attach(self, netns_pid: int) -> str:
        """Step 2: ``eth0`` in the network namespace of ``netns_pid`` (the pod's infra
        process); returns the pod's IP."""
        assert self.subnet is not None, "open() first"
        with self._lock:
            ip = str(self.subnet.network_address + self._next)
            self._next += 1
        node_end = f"vp{secrets.token_hex(4)}"
        _ip("link", "add", node_end, "type", "veth", "peer", "name", "eth0",
            "netns", str(netns_pid))
        _ip("link", "set", node_end, "master", self.bridge, "up")
        _ip("addr", "add", f"{ip}/24", "dev", "eth0", netns_pid=netns_pid)
        _ip("link", "set", "eth0", "up", netns_pid=netns_pid)
        _ip("route", "add", "default", "via", self.node_ip, netns_pid=netns_pid)
        return ip

    def close(self) -> None:
        """Step 3 (idempotent)."""
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)

    def __enter__(self) -> ClusterNetwork:
        return self.open()

    def __exit__(self, *_: object) -> None:
        self.close()
