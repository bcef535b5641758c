"""The coordinator's security posture: checked before it serves, logged at start, shown in
``/status`` (``security``).

A setting that would silently leave the API open refuses the start instead, with a message
naming the flag that fixes it. The refusals, as an error tree::

    InsecureSettings (a ValueError: ``serve`` prints it and exits with the usage code)
    ├── --token-file names a file that cannot be read
    ├── --token-file names an empty or whitespace-only file (auth would be off unnoticed)
    ├── SHUTDOWN_COORDINATOR_TOKEN is set but empty or whitespace
    ├── --host is not a loopback address and no token is configured
    │   (allowed only with --allow-unauthenticated-network)
    └── no token is configured and the host forbids netlink socket diagnostics (a seccomp
        filter, systemd's RestrictAddressFamilies without AF_NETLINK): callers could not
        be told apart, and every call that changes something would be refused
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any

from coordinator.service import browsers, reach, sock_diag
from coordinator.settings import ENV_PREFIX, Settings

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class InsecureSettings(ValueError):
    """Settings that would leave the coordinator open without saying so."""


@dataclass(frozen=True)
class Posture:
    """What protects the API. ``token`` is never shown; everything else is."""

    token: str | None
    host: str
    loopback: bool
    confine_to_pid: int | None
    unauthenticated_network: bool
    host_names: tuple[str, ...] = ()
    """The names (beside IP addresses) a request's ``Host`` may carry
    (``coordinator.service.browsers``)."""

    @property
    def auth(self) -> bool:
        return self.token is not None

    def registration(self) -> str:
        """Who may register (or report for) a process, in words."""
        where = ("any process" if self.confine_to_pid is None
                 else f"descendants of PID {self.confine_to_pid}")
        who = ("callers with the token" if self.auth else
               "local callers, each for processes of its own user (root: any)")
        return f"{who}; {where}; never PID 1, kernel threads, threads or the coordinator's " \
               "ancestors"

    def to_status(self) -> dict[str, Any]:
        return {
            "auth": self.auth,
            "host": self.host,
            "loopback": self.loopback,
            "confine_to_pid": self.confine_to_pid,
            "unauthenticated_network": self.unauthenticated_network,
            "registration": self.registration(),
            "hosts": self.hosts().describe(),
            "enforced": {**reach.rules(self), "browsers": browsers.RULE},
        }

    def hosts(self) -> browsers.HostNames:
        return browsers.HostNames(self.host_names)

    def summary(self) -> str:
        """One log line."""
        auth = "on" if self.auth else "OFF"
        bind = f"{self.host} ({'loopback' if self.loopback else 'NOT loopback'})"
        return f"security: auth {auth}; bind {bind}; registration: {self.registration()}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this host's own network stack.
    A wildcard (``0.0.0.0``, ``::``) or any other name is not."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def read_token(settings: Settings) -> str | None:
    """The configured token (the file wins over the variable), or None when none is set.
    Raises ``InsecureSettings`` for one that is set but cannot be used."""
    if settings.token_file is not None:
        path = settings.token_file
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InsecureSettings(
                f"--token-file {path}: cannot be read ({exc}); fix the file or its "
                "permissions, or remove --token-file to run without a token") from exc
        token = text.strip()
        if not token:
            raise InsecureSettings(
                f"--token-file {path} is empty: that would turn authentication off without a "
                "word; write the token into it, or remove --token-file to run without one")
        return token
    if settings.token is not None:
        token = settings.token.get_secret_value().strip()
        if not token:
            raise InsecureSettings(
                f"{ENV_PREFIX}TOKEN is set but empty; set the token, or unset the variable "
                "to run without one")
        return token
    return None


def check(settings: Settings) -> Posture:
    """The posture ``settings`` give, or ``InsecureSettings`` when they must not serve."""
    token = read_token(settings)
    loopback = is_loopback(settings.host)
    if token is None and not loopback and not settings.allow_unauthenticated_network:
        raise InsecureSettings(
            f"--host {settings.host} is reachable from other hosts and no token is set: "
            "anyone who can reach the port could drain and kill this pod. Give --token-file, "
            "bind a loopback address, or pass --allow-unauthenticated-network if the network "
            "itself is trusted")
    if token is None:
        why = sock_diag.available()
        if why is not None:
            raise InsecureSettings(
                "no token is set, and without one the coordinator holds each caller to what "
                "it could signal itself, telling callers apart by their sockets' owners "
                f"(netlink sock_diag), which this host does not allow ({why}): give "
                "--token-file, or allow AF_NETLINK (systemd: RestrictAddressFamilies)")
    return Posture(
        token=token,
        host=settings.host,
        loopback=loopback,
        confine_to_pid=settings.confine_to_pid,
        unauthenticated_network=token is None and not loopback,
        host_names=tuple(browsers.default_names(settings, os.environ)),
    )
