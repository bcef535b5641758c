"""A child that daemonizes when it comes up (``--daemonize``)."""

from __future__ import annotations

import os
import signal

import psutil

from tests.sim.conftest import StartEngine
from tests.sim.support import wait_ended, wait_gone
from tests.support.processes import ProcessJanitor


def test_a_daemon_leaves_the_tree_session_and_group_and_ends_on_sigterm(
    start_sim: StartEngine, janitor: ProcessJanitor
) -> None:
    """1. Start with --daemonize detokenizer. 2. The ready file lists the daemon; it is not
    a descendant of the main process, and has a session and group of its own (double fork
    and setsid), without PDEATHSIG. 3. The main process's graceful SIGTERM ends the tree but
    not the daemon. 4. SIGTERM to the daemon: its cleanup finishes, exit 0."""
    engine = start_sim(daemonize=("detokenizer",), graceful_main=True, schedulers=1)
    (daemon,) = engine.pids("daemon")
    janitor.adopt(daemon)
    tree = {p.pid for p in psutil.Process(engine.pid).children(recursive=True)}
    assert daemon not in tree
    assert os.getsid(daemon) not in (os.getsid(engine.pid), *tree)
    assert os.getpgid(daemon) == os.getsid(daemon) != os.getpgid(engine.pid)
    detokenizer = engine.record_of(engine.pids("detokenizer")[0])
    assert detokenizer is not None
    assert detokenizer["daemons"] == [daemon]
    record = engine.record_of(daemon)
    assert record is not None
    assert (record["role"], record["pdeathsig"], record["cleanup"]) == ("daemon", None,
                                                                       "not started")

    os.kill(engine.pid, signal.SIGTERM)
    assert engine.proc.wait(timeout=30) == 0
    assert psutil.Process(daemon).status() != psutil.STATUS_ZOMBIE
    os.kill(daemon, signal.SIGTERM)
    end = wait_ended(engine, daemon)
    assert (end["cleanup"], end["exit_code"], end["signal"]) == ("finished", 0, "SIGTERM")
    wait_gone(daemon)
