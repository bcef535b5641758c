"""Coordinators found by DNS: every address of a name, followed as pods come and go.

In Kubernetes the pods' coordinators are the addresses of a headless Service
(``deploy/kubernetes/base/services.yaml``: ``inference-engine-coordinator``, with
``publishNotReadyAddresses`` so a draining pod, no longer Ready, is still listed). The proxy
cannot name them on its command line, so ``--coordinators-dns NAME:PORT`` resolves the name
every ``--dns-interval`` seconds and hands the addresses to the acknowledgements
(``HandoffAcks.discovered``): a new pod's coordinator is watched from its first answer, a
deleted pod's is forgotten.

A lookup that fails keeps that name's last answer: a DNS hiccup during a drain must not make
the proxy forget the coordinator waiting for its acknowledgement.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence

log = logging.getLogger("continuation_proxy.discovery")

DNS_INTERVAL_S = 5.0
"""Between two lookups (s): a new pod is Ready seconds after it is listed, and an
acknowledgement waits ``router_client.handoff_acks.FIND_WITHIN_S`` before it goes to every
coordinator anyway."""


def parse_name(text: str) -> tuple[str, int]:
    """``NAME:PORT`` → (name, port); ``ValueError`` saying what is wrong."""
    name, sep, port = text.rpartition(":")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not NAME:PORT (a DNS name and a port 1-65535)")
    return name.strip("[]"), int(port)


def url_of(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


async def resolve(name: str, port: int) -> set[str]:
    """Every address of ``name``, as coordinator URLs (``OSError`` when the lookup fails)."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return {url_of(str(info[4][0]), port) for info in infos}


async def follow(names: Sequence[tuple[str, int]],
                 found: Callable[[Iterable[str]], Awaitable[None]],
                 interval_s: float = DNS_INTERVAL_S) -> None:
    """Until cancelled: 1. resolve every name (a failed one keeps its last answer);
    2. hand the union to ``found``; 3. wait ``interval_s``."""
    last: dict[tuple[str, int], set[str]] = {}
    while True:
        for name, port in names:
            try:
                last[(name, port)] = await resolve(name, port)
            except OSError as exc:
                log.warning("coordinators: %s did not resolve (%s); keeping its last %d",
                            name, exc, len(last.get((name, port), ())))
        try:
            await found(set().union(*last.values()) if last else set())
        except Exception:  # a background task: log, never stop following
            log.exception("coordinators: could not follow what %s resolved to",
                          ", ".join(n for n, _ in names))
        await asyncio.sleep(interval_s)
