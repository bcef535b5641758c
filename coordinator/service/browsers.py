"""What a web browser may not make the coordinator do: the checks on a request's head that
keep a page from another site (or a DNS name rebound to this host) from draining the pod.

A browser sends requests for any page it shows, to any address, with none of the caller's
own credentials: ``<img src="http://127.0.0.1:8787/drain">``, a form posted to ``/drain``,
or, after a DNS rebinding, a script of ``http://evil.example:8787`` whose name now resolves
to the pod. Every request (probes included) is judged on its head, in order:

    1. ``Host`` must name the coordinator (421 otherwise): any IP address literal (the pod IP,
       loopback, what a Service or the kubelet dials), ``localhost``, this host's name, the
       group's names, and the names given by ``--allowed-host`` (``*``: any). A rebound DNS
       name is none of these. A request without ``Host`` (HTTP/1.0) is not a browser's;
    2. ``Sec-Fetch-Site: cross-site`` or ``same-site`` is refused (403): the browser says
       another site or origin made the request (a top-level visit is ``none``, the
       coordinator's own page ``same-origin``);
    3. an ``Origin`` that is not the request's own (``scheme://`` + its ``Host``), or is
       ``null``, is refused (403): browsers send it with every form post and cross-origin
       script call, old ones without ``Sec-Fetch-Site`` included;
    4. a body a page may send without asking (a form's ``application/x-www-form-urlencoded``,
       ``multipart/form-data``, ``text/plain``) is refused on any method but GET and HEAD
       (415): the API reads JSON, and a form post is never an operator's call.

The kubelet's ``GET /drain`` and probes send none of ``Origin``, ``Sec-Fetch-Site`` or a
body, and their ``Host`` is the pod IP: they pass. What remains open is a plain GET from a
browser too old to send ``Sec-Fetch-Site`` (Chromium before 76, Firefox before 90, Safari
before 16.4) to an address literal, e.g. ``<img src="http://127.0.0.1:8787/drain">``: with a
token configured it is answered 401; without one, only where the caller's socket reaches
what the drain would signal (``coordinator.service.reach``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
ANY = "*"
"""``--allowed-host *``: no Host check."""
FORM_TYPES = frozenset({b"application/x-www-form-urlencoded", b"multipart/form-data",
                        b"text/plain"})
"""The bodies a page may send to any address without the browser asking the server first."""
CROSS = frozenset({b"cross-site", b"same-site"})
SAFE_METHODS = frozenset({"GET", "HEAD"})
ACCEPTED_KEPT = 256
"""``Host`` values remembered as accepted (an unbounded cache would be a memory sink)."""
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
RULE = ("every path: a Host not in security.hosts is answered 421; Sec-Fetch-Site cross-site "
        "or same-site, or an Origin other than the request's own, 403; a web form's body "
        "(urlencoded, multipart, text/plain) on any method but GET and HEAD, 415")


class BrowserRefusal(Exception):
    """A request refused on its head: ``status`` and ``detail``."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def default_names(settings: Any, environ: Mapping[str, str]) -> list[str]:
    """The names (not addresses) the coordinator answers to: loopback names, this host's
    name, ``--host`` when it is a name, the group's names (``LWS_LEADER_ADDRESS``,
    ``--group-leader``, ``--group-url``), then ``--allowed-host``."""
    names = [*LOOPBACK_NAMES, socket.gethostname()]
    names.append(settings.host)
    if environ.get(LWS_LEADER_ADDRESS):
        names.append(environ[LWS_LEADER_ADDRESS])
    for url in (settings.group_leader, settings.group_url):
        if url:
            names.append(urlsplit(url).hostname or "")
    names += list(settings.allowed_hosts)
    kept: list[str] = []
    for name in names:
        plain = name.strip().strip("[]").rstrip(".").lower()
        if plain and plain not in kept and (plain == ANY or not _is_address(plain)):
            kept.append(plain)
    return kept


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostNames:
    """The ``Host`` values the coordinator answers to (step 1)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.any = ANY in self.names
        self._accepted: set[bytes] = set()

    def describe(self) -> list[str]:
        """What ``/status`` ``security.hosts`` shows."""
        if self.any:
            return ["any (--allowed-host *)"]
        return ["any IP address", *sorted(self.names)]

    def accepts(self, host: bytes) -> bool:
        """Whether a ``Host`` header value names the coordinator (its port is not judged)."""
        if self.any or host in self._accepted:
            return True
        try:
            text = host.decode("ascii").strip().lower()
        except UnicodeDecodeError:
            return False
        if text.startswith("["):
            name, bracket, _port = text[1:].partition("]")
            ok = bool(bracket) and _is_address(name)
        else:
            name = text.rsplit(":", 1)[0] if text.count(":") == 1 else text
            name = name.rstrip(".")
            ok = name in self.names or (name.count(".") == 3 and _is_address(name))
        if ok and len(self._accepted) < ACCEPTED_KEPT:
            self._accepted.add(host)
        return ok


def judge(hosts: HostNames, method: str, host: bytes | None, origin: bytes | None,
          fetch_site: bytes | None, content_type: bytes | None) -> None:
    """Raise ``BrowserRefusal`` for a request a browser made for another site (the module
    docstring's steps)."""
    if host is not None and not hosts.accepts(host):
        shown = host.decode("latin-1")[:100]
        raise BrowserRefusal(421, f"Host {shown!r} is not a name this coordinator answers "
                             "to (an IP address, localhost, this host's name, or one given "
                             "by --allowed-host): a DNS name rebound to this address is "
                             "refused")
    if fetch_site is not None and fetch_site.strip().lower() in CROSS:
        raise BrowserRefusal(403, f"refused: a browser made this request for another site "
                             f"(Sec-Fetch-Site: {fetch_site.decode('latin-1')[:20]})")
    if origin is not None and not _same_origin(origin, host):
        raise BrowserRefusal(403, f"refused: a page of another origin "
                             f"({origin.decode('latin-1')[:100]!r}) made this request")
    if content_type is not None and method not in SAFE_METHODS:
        media = content_type.split(b";", 1)[0].strip().lower()
        if media in FORM_TYPES:
            raise BrowserRefusal(415, f"a {media.decode('latin-1')} body is what a web form "
                                 "sends; the API reads JSON: send application/json, or no "
                                 "body")


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether ``Origin`` names the request's own ``Host`` (``null`` never does)."""
    scheme, sep, authority = origin.strip().lower().partition(b"://")
    if not sep or scheme not in (b"http", b"https") or host is None:
        return False
    return authority.rstrip(b"/") == host.strip().lower()
