"""Coordinators found by DNS: the names the proxy is given, and the coordinators followed as
pods come and go (``HandoffAcks.discovered``), without a network: the watcher's long-polls
to addresses nothing listens on only retry."""

from __future__ import annotations

import pytest

from continuation_proxy import discovery
from continuation_proxy.cli import parse_args
from router_client.handoff_acks import HandoffAcks

NAMED = "http://127.0.0.1:9"


def test_names_are_name_colon_port() -> None:
    """1. ``NAME:PORT`` and ``[IPv6]:PORT`` parse; 2. anything else names what is wrong, and
    the command line refuses it with a usage error."""
    assert discovery.parse_name("coordinators.ns.svc:8787") == ("coordinators.ns.svc", 8787)
    assert discovery.parse_name("[::1]:8787") == ("::1", 8787)
    assert discovery.url_of("::1", 8787) == "http://[::1]:8787"
    for bad in ("coordinators", ":8787", "name:0", "name:65536", "name:http"):
        with pytest.raises(ValueError, match="NAME:PORT"):
            discovery.parse_name(bad)
    with pytest.raises(SystemExit):
        parse_args(["--upstream", "http://r:1", "--coordinators-dns", "no-port"])


async def test_discovered_coordinators_are_followed_and_the_gone_ones_forgotten() -> None:
    """1. One coordinator named at the start; a lookup finds two more: all three are
    followed. 2. The next lookup finds one of the two: the other is forgotten, the named
    one stays. 3. An empty answer keeps only the named one."""
    acks = HandoffAcks([NAMED])
    try:
        await acks.discovered({"http://127.0.0.2:9", "http://127.0.0.3:9"})
        assert acks.followed() == {NAMED, "http://127.0.0.2:9", "http://127.0.0.3:9"}
        await acks.discovered({"http://127.0.0.3:9"})
        assert acks.followed() == {NAMED, "http://127.0.0.3:9"}
        await acks.discovered(set())
        assert acks.followed() == {NAMED}
    finally:
        await acks.close()


async def test_resolving_localhost_gives_its_loopback_addresses() -> None:
    """The lookup the proxy runs: ``localhost`` gives 127.0.0.1 (and ::1 where the host
    has it), as coordinator URLs on the port asked."""
    urls = await discovery.resolve("localhost", 8787)
    assert "http://127.0.0.1:8787" in urls
    assert urls <= {"http://127.0.0.1:8787", "http://[::1]:8787"}
