"""``strace_record`` puts each event down to its process, whichever thread it happened in.

A real Python process with threads, traced the way the engine tests trace SGLang: a signal
sent to the process is taken by a thread that does not block it, a thread calls ``kill``, a
thread started after strace attached sends a ``tgkill``; each is read back under the process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines import strace_record
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = pytest.mark.skipif(not strace_record.available(), reason="strace is not installed")

CHILD = r"""
import os, signal, sys, threading
control = open(sys.argv[1])  # the test's lines, through a FIFO
signal.signal(signal.SIGUSR1, lambda *_: None)
signal.signal(signal.SIGUSR2, lambda *_: None)
go = threading.Event()
def taker():  # nothing blocked here: it takes the SIGUSR1 sent to the process
    go.wait()
    os.kill(os.getpid(), signal.SIGUSR2)
taker_thread = threading.Thread(target=taker)
taker_thread.start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # the main thread's only
print("ready", flush=True)
control.readline()  # strace attached
main = threading.main_thread().ident
late = threading.Thread(target=signal.pthread_kill, args=(main, signal.SIGUSR2))
late.start()
late.join()
print("waiting", flush=True)
control.readline()  # the SIGUSR1 sent
go.set()
taker_thread.join()
sys.exit(3)
"""


def test_a_threads_signals_and_calls_are_its_process(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a process whose main thread blocks SIGUSR1, one thread waiting for it, strace
    attached; the threads it has then are listed, as ``trace_tree`` lists them;
    2. it starts another thread (after strace attached), which ``tgkill``s the main thread;
    the test sends SIGUSR1 to the process, its waiting thread takes it and ``kill``s the
    process with SIGUSR2; the process exits 3;
    3. the record: one end, the process's (exit 3, not its threads' ends), the SIGUSR1 from
    the test among what the process received, and both calls made by threads (the ``kill``
    and the late thread's ``tgkill``) sent by the process."""
    fifo = tmp_path / "control"
    os.mkfifo(fifo)
    proc = janitor.spawn([sys.executable, "-c", CHILD, str(fifo)], stdout=subprocess.PIPE,
                         text=True)
    assert proc.stdout is not None
    control = fifo.open("w")
    assert proc.stdout.readline() == "ready\n"
    out = tmp_path / "strace.txt"
    log = (tmp_path / "strace.log").open("ab")
    tracer = janitor.spawn(strace_record.attach_argv([proc.pid], out), stdout=log,
                           stderr=subprocess.STDOUT)
    wait_for(lambda: "attached" in (tmp_path / "strace.log").read_text(), timeout=30,
             what="strace attached")
    threads = strace_record.process_threads([proc.pid])
    assert len(threads) == 2, threads
    control.write("go\n")
    control.flush()
    assert proc.stdout.readline() == "waiting\n"
    proc.send_signal(signal.SIGUSR1)
    control.write("go\n")
    control.close()
    assert proc.wait(timeout=30) == 3
    tracer.wait(timeout=30)
    log.close()

    record = strace_record.parse(out.read_text(), threads)

    assert set(record.ends) == {proc.pid}, record.ends
    assert record.ends[proc.pid].exit_code == 3
    senders = [r.sender for r in record.ends[proc.pid].received if r.signal == "SIGUSR1"]
    assert senders, record.ends[proc.pid]
    assert senders[0] not in threads, senders  # the test's own PID
    sent = [(call.target, call.signal) for call in record.sent.get(proc.pid, ())]
    assert sent.count((proc.pid, "SIGUSR2")) == 2, record.sent
    assert set(record.sent) == {proc.pid}, record.sent
