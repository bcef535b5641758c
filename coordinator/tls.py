"""What the coordinator's HTTP clients verify TLS certificates against.

httpx loads the system's CA bundle into a new SSL context for every client it builds: 18 ms
of CPU each time on a 2-core machine, paid at every start of a coordinator told of a router
and at every drain that reads an adopted engine's metrics, on the cores the pod's engine and
its neighbours serve from. The URLs these clients call come from the settings and are
plain ``http://`` on a pod network, where the bundle is never used: a client whose URLs are
all plain http gets a context that trusts no certificate authority instead, built in
microseconds. Such a client follows no redirect (httpx's default), and were it ever to reach
a TLS server its verification would fail: it fails closed, never unverified.
"""

from __future__ import annotations

import ssl


def verify_for(*urls: str | None) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for a client that calls only ``urls`` (None: not configured):
    True (the CA bundle, as httpx does by default) when any of them is https, else a context
    that verifies against nothing."""
    if any(url is not None and url.strip().lower().startswith("https:") for url in urls):
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
