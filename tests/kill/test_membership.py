"""Unit membership (cgroup, mount namespace), sessions and the coordinator's own clients.

Pure parsing first; then real trees in a cgroup v2 or a mount namespace of their own, whose
processes daemonize, checked against /proc and the processes' own records.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from coordinator.kill import Fate, KillPolicy, Target, callers, membership, terminate
from coordinator.kill.membership import Placement, Unit
from tests.kill.helpers import start_time
from tests.support.processes import ProcessJanitor, wait_for
from tests.support.units import KINDS, adopt_daemons, engine_unit, running

HYBRID = "9:name=systemd:/\n8:pids:/\n2:cpu,cpuacct:/\n0::/\n"
POLICY = KillPolicy(tier_timeout_s=20, deadline_s=40)


def placement(v2: str | None = "/", systemd: str | None = "/", mnt: str | None = "mnt:[1]",
              ) -> Placement:
    cgroups = {k: v for k, v in (("", v2), ("name=systemd", systemd)) if v is not None}
    return Placement(cgroups, mnt)


INIT = placement(v2="/init.scope", systemd="/init.scope")
"""PID 1 of a host, in a cgroup of its own (as systemd puts itself)."""


# --- parsing ----------------------------------------------------------------------------


def test_parse_cgroup_reads_v2_and_each_v1_controller() -> None:
    assert membership.parse_cgroup("0::/kubepods/pod1/cri-abc\n") == {"": "/kubepods/pod1/cri-abc"}
    parsed = membership.parse_cgroup(HYBRID + "7:name=odd:/a:b\nbroken\n")
    assert parsed == {"name=systemd": "/", "pids": "/", "cpu": "/", "cpuacct": "/", "": "/",
                      "name=odd": "/a:b"}
    assert membership.parse_cgroup("") == {}


def test_within_is_a_path_prefix_not_a_string_prefix() -> None:
    assert membership.within("/a", "/a")
    assert membership.within("/a/b/c", "/a")
    assert membership.within("/a/b", "/")
    assert not membership.within("/ab", "/a")
    assert not membership.within("/", "/a")


def test_unit_of_adds_nothing_on_a_plain_host() -> None:
    """Root and coordinator in one cgroup and one mount namespace: no usable key."""
    assert membership.unit_of(placement(), placement(), [INIT]) is None
    assert membership.unit_of(placement(), None, [INIT]) is None


def test_unit_of_uses_v2_then_falls_back_to_v1() -> None:
    own = placement()
    assert membership.unit_of(placement(v2="/engine"), own, [INIT]) == Unit("", "/engine", None)
    # v2 unused (everything at its root), the v1 name=systemd hierarchy tells them apart
    assert membership.unit_of(placement(systemd="/docker/abc"), own, [INIT]) == Unit(
        "name=systemd", "/docker/abc", None)
    assert membership.unit_of(placement(v2=None, systemd="/docker/abc"), own, [INIT]) == Unit(
        "name=systemd", "/docker/abc", None)
    pids = Placement({"pids": "/docker/abc"}, "mnt:[1]")
    host = Placement({"pids": "/"}, "mnt:[1]")
    assert membership.unit_of(pids, host, [host]) == Unit("pids", "/docker/abc", None)


def test_a_cgroup_that_holds_the_coordinator_or_pid_1_is_not_the_engines() -> None:
    own = placement(v2="/pod/coordinator")
    assert membership.unit_of(placement(v2="/pod"), own, [INIT]) is None
    assert membership.unit_of(placement(v2="/pod/engine"), own, [INIT]) == Unit(
        "", "/pod/engine", None)
    # PID 1 in the root's cgroup: the host's (or a container init we cannot tell apart)
    assert membership.unit_of(placement(v2="/user.slice"), placement(v2="/docker/c"),
                              [placement(v2="/user.slice/init.scope")]) is None


def test_unit_of_uses_a_mount_namespace_of_its_own() -> None:
    assert membership.unit_of(placement(mnt="mnt:[2]"), placement(), [INIT]) == Unit(
        None, None, "mnt:[2]")
    assert membership.unit_of(placement(mnt="mnt:[2]"), placement(mnt=None), [INIT]) is None
    # the coordinator in a container of its own, the engine in the host's namespace
    assert membership.unit_of(placement(mnt="mnt:[1]"), placement(mnt="mnt:[3]"), [INIT]) is None
    # PID 1's namespace unreadable: an ancestor of ours in the host's namespace tells it
    unreadable = placement(mnt=None)
    assert membership.unit_of(placement(mnt="mnt:[1]"), placement(mnt="mnt:[3]"),
                              [unreadable, placement(mnt="mnt:[1]")]) is None
    assert membership.unit_of(placement(mnt="mnt:[2]"), placement(mnt="mnt:[3]"),
                              [unreadable]) == Unit(None, None, "mnt:[2]")


def test_unit_holds_its_subtree_and_its_mount_namespace() -> None:
    unit = Unit("", "/engine", "mnt:[2]")
    assert unit.holds(placement(v2="/engine/sub")) == "cgroup /engine"
    assert unit.holds(placement(v2="/engine2")) is None
    assert unit.holds(placement(v2="/other", mnt="mnt:[2]")) == "mount namespace mnt:[2]"
    assert Unit("name=systemd", "/d", None).holds(placement(systemd="/d")) == \
        "cgroup name=systemd:/d"


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout
   0: 0100007F:2253 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 101 1
   1: 0100007F:2253 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 102 1
   2: 0100007F:D431 0100007F:2253 01 00000000:00000000 00:00000000 00000000     0        0 103 1
   3: 0100007F:9000 0100007F:2253 01 00000000:00000000 00:00000000 00000000     0        0 104 1
"""
TCP6 = """  sl  local_address                         remote_address                        st
   0: 0000000000000000FFFF00000100007F:2253 0000000000000000FFFF00000100007F:D432 01 0:0 0:0 0 0 0 201 1
   1: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 202 1
"""  # noqa: E501


def test_parse_net_tcp_reads_v4_v6_and_v4_mapped_addresses() -> None:
    v4 = callers.parse_net_tcp(TCP)
    assert [(str(s.local[0]), s.local[1], s.state, s.inode) for s in v4[:2]] == [
        ("127.0.0.1", 0x2253, callers.LISTEN, 101), ("127.0.0.1", 0x2253, 1, 102)]
    v6 = callers.parse_net_tcp(TCP6)
    assert (str(v6[0].local[0]), v6[0].remote[1]) == ("127.0.0.1", 0xD432)
    assert str(v6[1].local[0]) == "::1"


def test_client_ends_are_the_peers_of_connections_our_listener_accepted() -> None:
    sockets = callers.parse_net_tcp(TCP) + callers.parse_net_tcp(TCP6)
    ends = callers.client_ends(sockets, ours={101, 102, 201})
    clients = {s.inode for s in sockets if (s.local, s.remote) in ends}
    assert clients == {103}  # 104 is connected to the port, not through a socket of ours
    assert callers.client_ends(sockets, ours={102}) == set()  # no listener of ours


# --- live -------------------------------------------------------------------------------


def test_own_placement_is_readable_and_not_a_unit() -> None:
    own = membership.read(os.getpid())
    assert own is not None
    assert own.mnt is not None
    assert "" in own.cgroups
    assert membership.unit_of(own, membership.read(os.getpid()), membership.bystanders()) is None
    assert membership.read(os.getpid(), start_ticks=1) is None  # another process's ticks


def test_clients_finds_the_process_connected_to_our_listener(janitor: ProcessJanitor) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket,sys; s=socket.create_connection(('127.0.0.1',{port})); " \
               "s.recv(1); sys.stdin.read()"
        client = janitor.spawn_python(["-c", code])
        bystander = janitor.spawn_python(["-c", "import time; time.sleep(60)"], service=True,
                                         exit_code=-signal.SIGTERM)
        conn, _ = server.accept()
        with conn:
            assert callers.clients([client.pid, bystander.pid]) == {client.pid}
        wait_for(lambda: callers.clients([client.pid]) == set(), what="connection closed")
        # Our end closing empties the table at once; the client still has to see the EOF
        # and exit, which takes a while on a loaded machine.
        assert client.wait(timeout=60) == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_process_daemonizing_during_the_kill_is_found_in_the_unit(
    janitor: ProcessJanitor, tmp_path: Path, kind: str
) -> None:
    """1. a root and a child, in a cgroup or mount namespace of their own; the child
    daemonizes (double fork, setsid) when SIGTERM arrives, then exits; 2. terminate the
    root; 3. the daemon is in the report, found in the unit, ended by its graceful signal
    (its own record) before the root was signalled, and gone per /proc."""
    with engine_unit(kind, janitor) as unit:
        tree = unit.start_tree(janitor, tmp_path, "--children", "1", "--daemon", "on-term")
        (child,) = tree["children"]
        report = await terminate([Target(tree["pid"], start_time(tree["pid"]))], POLICY)
        (daemon,) = adopt_daemons(janitor, tmp_path)
        outcomes = {o.pid: o for o in report.processes}
        assert sorted(outcomes) == sorted([tree["pid"], child, daemon["pid"]]), report.to_dict()
        found = outcomes[daemon["pid"]]
        assert daemon["sid"] not in (tree["pid"], child)
        assert daemon["ppid"] != child
        where = "cgroup" if kind == "cgroup" else "mount namespace"
        assert f"left its tree (daemonized); found in the engine's {where}" in found.detail
        assert (found.fate, found.signal, found.root_pid) == (Fate.EXITED, "SIGTERM",
                                                                tree["pid"])
        assert found.depth == 2
        assert found.tier == "depth-2"
        assert (tmp_path / f"daemon-{daemon['pid']}.json").exists()
        assert not running(daemon["pid"], daemon["start_ticks"])
        assert (tmp_path / f"child-{child}.json").exists()
        assert (tmp_path / f"root-{tree['pid']}.json").exists()
        assert outcomes[tree["pid"]].signalled_at >= found.ended_at  # type: ignore[operator]
        assert report.graceful, report.to_dict()


async def test_on_a_plain_host_membership_adds_nothing(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. the same tree in the coordinator's own cgroup and mount namespace, its child
    daemonizing at once; 2. terminate; 3. the daemon (its own session, reparented) is not
    part of the kill: nothing tells it from any other process of the host."""
    with engine_unit("none", janitor) as unit:
        tree = unit.start_tree(janitor, tmp_path, "--children", "1", "--daemon", "now")
        (daemon,) = adopt_daemons(janitor, tmp_path)
        report = await terminate([Target(tree["pid"], start_time(tree["pid"]))], POLICY)
        assert sorted(o.pid for o in report.processes) == sorted(
            [tree["pid"], *tree["children"]])
        assert running(daemon["pid"], daemon["start_ticks"])
        assert not (tmp_path / f"daemon-{daemon['pid']}.json").exists()
        os.kill(daemon["pid"], signal.SIGTERM)  # the test's to end, as nothing else finds it
        wait_for(lambda: not running(daemon["pid"], daemon["start_ticks"]), what="daemon end")


async def test_a_process_reparented_in_the_roots_session_is_found(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root leading its own session; its child double forks (no setsid) before the
    kill, so the grandchild is reparented away but stays in the session; 2. terminate;
    3. it is found through the session, ended gracefully, gone per /proc."""
    with engine_unit("none", janitor) as unit:
        tree = unit.start_tree(janitor, tmp_path, "--children", "1", "--daemon", "orphan")
        (orphan,) = adopt_daemons(janitor, tmp_path)
        assert orphan["sid"] == tree["pid"]
        assert orphan["ppid"] != tree["children"][0]
        report = await terminate([Target(tree["pid"], start_time(tree["pid"]))], POLICY)
        outcomes = {o.pid: o for o in report.processes}
        assert len(outcomes) == 3, report.to_dict()
        found = outcomes[orphan["pid"]]
        assert "in the session its process" in found.detail
        assert found.fate is Fate.EXITED
        assert found.depth == 2
        assert (tmp_path / f"daemon-{orphan['pid']}.json").exists()
        assert not running(orphan["pid"], orphan["start_ticks"])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_client_of_ours_in_the_unit_is_left_alone(
    janitor: ProcessJanitor, tmp_path: Path, kind: str
) -> None:
    """1. a tree in its own unit, and in the same unit a shell whose child holds a
    connection to a socket this process listens on (as the preStop hook waits on the
    coordinator); 2. terminate the tree; 3. the daemon of the unit is ended, the client and
    its parent shell are neither in the report nor signalled, and a note says why."""
    with engine_unit(kind, janitor) as unit, socket.create_server(("127.0.0.1", 0)) as server:
        tree = unit.start_tree(janitor, tmp_path, "--children", "1", "--daemon", "now")
        (daemon,) = adopt_daemons(janitor, tmp_path)
        port = server.getsockname()[1]
        code = (f"import socket,sys; s=socket.create_connection(('127.0.0.1',{port})); "
                "s.recv(1)")
        script = f'{sys.executable} -c "{code}"; echo $? > {tmp_path}/client.exit'
        shell = janitor.spawn([*unit.joining(tree["pid"]), "sh", "-c", script])
        conn, _ = server.accept()
        with conn:
            client = wait_for(lambda: [p for p in unit.members() if p not in (
                tree["pid"], *tree["children"], daemon["pid"], shell.pid)], what="client")
            report = await terminate([Target(tree["pid"], start_time(tree["pid"]))], POLICY)
            outcomes = {o.pid: o for o in report.processes}
            assert sorted(outcomes) == sorted([tree["pid"], *tree["children"], daemon["pid"]])
            assert outcomes[daemon["pid"]].fate is Fate.EXITED
            assert all(running(pid) for pid in [shell.pid, *client])
            assert any(f"pid {client[0]} " in note for note in report.notes), report.notes
            assert any(f"pid {shell.pid} " in note for note in report.notes), report.notes
        assert shell.wait(timeout=30) == 0
        assert (tmp_path / "client.exit").read_text().strip() == "0"
