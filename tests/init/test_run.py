"""``shutdown-coordinator run -- COMMAND``: what an init does, held to each process's own
record (``tests.init.recorder``, the simulated engine's end records) and to ``/proc``."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator import exit_codes
from devstack.sim import EngineKnobs
from tests.deploy.held_stream import Stream
from tests.init.wrapper import (
    records,
    sim_command,
    sim_ready,
    start_wrapper,
)
from tests.support.processes import ProcessJanitor, wait_for

SIM = EngineKnobs(schedulers=2, watchdog=True, teardown_s=0.2, graceful_main=True)
"""SGLang's shape (two schedulers and a detokenizer with PDEATHSIG, a child watchdog) with the
upstream fix: its main process stops its children and exits 0 on SIGTERM."""


def _alive(pids: list[int]) -> list[int]:
    """The PIDs still running (zombies count as ended)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def _children(pid: int) -> list[tuple[int, str]]:
    """(PID, state) of every child of ``pid`` now."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append((int(entry), fields[0]))
    return out


@pytest.mark.parametrize(("script", "status", "main"), [
    ("exit 0", 0, "exited 0"),
    ("exit 3", 3, "exited 3"),
    ("kill -USR1 $$", 128 + signal.SIGUSR1, "killed by SIGUSR1"),
    ("kill -KILL $$", 128 + signal.SIGKILL, "killed by SIGKILL"),
], ids=["zero", "three", "sigusr1", "sigkill"])
def test_exits_with_the_commands_own_status(janitor: ProcessJanitor, tmp_path: Path,
                                            script: str, status: int, main: str) -> None:
    """1. Run ``sh -c SCRIPT`` under the wrapper; it ends before any drain.
    2. The wrapper exits with the command's status (128 + n for a signal, as shells and tini
       report it), writes nothing to stdout, and its summary is the log's last line."""
    wrapper = start_wrapper(janitor, tmp_path, ["sh", "-c", script])
    assert wrapper.wait() == status, wrapper.log.read_text()
    summary = wrapper.summary()
    assert summary["exit_code"] == str(status)
    assert summary["main"] == main
    assert summary["drain"] is None
    assert wrapper.out.read_bytes() == b""


def test_a_command_that_cannot_start(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A command that does not exist: 127; a file that is not executable: 126; no command
       at all: the usage code. Each says why on stderr, and nothing listens."""
    missing = start_wrapper(janitor, tmp_path / "missing", ["no-such-engine-here"])
    assert missing.wait() == 127
    assert "cannot run 'no-such-engine-here'" in missing.log.read_text()
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    denied = start_wrapper(janitor, tmp_path / "denied", [str(plain)])
    assert denied.wait() == 126
    none = start_wrapper(janitor, tmp_path / "none", [])
    assert none.wait() == exit_codes.USAGE
    assert "no command" in none.log.read_text()
    assert not (tmp_path / "missing" / "port.json").exists()


def test_streams_pass_through_untouched(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Feed the wrapper's stdin from a pipe; the command copies stdin to stdout, writes a
       line to stderr, and waits for SIGTERM.
    2. The command's stdout is the wrapper's, byte for byte, and nothing else is on it; its
       stderr line is in the wrapper's stderr; its descriptors 0, 1 and 2 are the wrapper's
       own (the same pipe and files, no relay in between)."""
    copier = ("import os, signal, sys\n"
              "data = sys.stdin.buffer.read()\n"
              "sys.stdout.buffer.write(data); sys.stdout.flush()\n"
              "sys.stderr.write('from the engine on stderr\\n'); sys.stderr.flush()\n"
              "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
              "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
              "signal.sigwait({signal.SIGTERM})\n")
    pid_file = tmp_path / "engine.pid"
    payload = "line one\\nbinary \\001\\002 end"
    wrapper = start_wrapper(janitor, tmp_path, [sys.executable, "-c", copier, str(pid_file)],
                            shell_prefix=f"printf '{payload}' |")
    engine = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(),
                          what="the engine's pid"))
    # The wrapper is the pipeline's last element: the engine's parent, a child of the shell.
    init = int(Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert "coordinator" in Path(f"/proc/{init}/cmdline").read_text()
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{engine}/fd/{fd}") == os.readlink(f"/proc/{init}/fd/{fd}")
    assert os.readlink(f"/proc/{engine}/fd/0").startswith("pipe:")
    os.kill(init, signal.SIGTERM)
    assert wrapper.wait() == 0, wrapper.log.read_text()
    assert wrapper.out.read_bytes() == b"line one\nbinary \x01\x02 end"
    assert "from the engine on stderr" in wrapper.log.read_text()


def test_other_signals_go_to_the_main_process_alone(janitor: ProcessJanitor,
                                                    tmp_path: Path) -> None:
    """1. Run a recorder that starts a child of its own (same process group) under the
       wrapper.
    2. Send the wrapper SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2 and SIGWINCH.
    3. The main process records each of them, in order; its child records none; the
       wrapper runs on.
    4. SIGTERM: the drain ends the child first (it records SIGTERM and exits 0), then the
       main process; the wrapper exits 0."""
    wrapper = start_wrapper(janitor, tmp_path, [sys.executable, "-m", "tests.init.recorder",
                                                str(tmp_path), "--child"])
    ready = wait_for(lambda: (tmp_path / "ready.json").exists() and json.loads(
        (tmp_path / "ready.json").read_text()), what="the recorder ready")
    main_record = tmp_path / f"main-{ready['main']}.json"
    child_record = tmp_path / f"child-{ready['child']}.json"
    sent = [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
            signal.SIGWINCH]
    def recorded(count: int) -> bool:
        return len(json.loads(main_record.read_text())["signals"]) >= count

    for count, sig in enumerate(sent, start=1):
        wrapper.proc.send_signal(sig)
        wait_for(lambda: recorded(count),  # noqa: B023 - called before the next round
                 what=f"{sig.name} passed on")
    assert json.loads(main_record.read_text())["signals"] == [s.name for s in sent]
    assert wrapper.proc.poll() is None
    wrapper.proc.send_signal(signal.SIGTERM)
    assert wrapper.wait() == 0, wrapper.log.read_text()
    child = json.loads(child_record.read_text())
    main = json.loads(main_record.read_text())
    assert child["signals"] == ["SIGTERM"]
    assert child["exit_code"] == 0
    assert main["signals"][-1] == "SIGTERM"
    assert main["exit_code"] == 0
    assert wrapper.summary()["drain"] == "graceful"


def test_an_operators_drain_is_waited_for_and_an_abort_keeps_the_engine(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A recorder with a child of its own under the wrapper, a 20 s minimum drain.
    2. ``POST /drain`` (``wait=false``), then ``DELETE /drain`` while it is still draining:
       the pod is serving again, nothing was signalled, the wrapper runs on.
    3. ``POST /drain`` with a 5 s budget, as an operator drains a pod by hand: the drain
       ends the child, then the main process, each exits 0; the wrapper, whose engine has
       ended, exits 0 and names the operator's drain."""
    wrapper = start_wrapper(janitor, tmp_path, [sys.executable, "-m", "tests.init.recorder",
                                                str(tmp_path), "--child"], "--min-drain", "20")
    ready = wait_for(lambda: (tmp_path / "ready.json").exists() and json.loads(
        (tmp_path / "ready.json").read_text()), what="the recorder ready")
    url = wrapper.url()
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
        assert client.delete("/drain").json()["aborted"] is True
        assert client.get("/status").json()["phase"] == "serving"
        for role in ("main", "child"):
            record = json.loads((tmp_path / f"{role}-{ready[role]}.json").read_text())
            assert record["signals"] == [], record
        assert wrapper.proc.poll() is None
        done = client.post("/drain", json={"deadline_s": 5, "reason": "by hand"})
        assert done.json()["phase"] == "done", done.text
    assert wrapper.wait() == 0, wrapper.log.read_text()
    child = json.loads((tmp_path / f"child-{ready['child']}.json").read_text())
    main = json.loads((tmp_path / f"main-{ready['main']}.json").read_text())
    assert (child["signals"], child["exit_code"]) == (["SIGTERM"], 0)
    assert (main["signals"], main["exit_code"]) == (["SIGTERM"], 0)
    summary = wrapper.summary()
    assert summary["reason"] == "by hand"
    assert summary["stop_signals"] == "0"


def test_a_neighbour_matching_the_pattern_is_neither_adopted_nor_warned_of(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Outside the wrapper, a recorder whose command line matches ``--adopt-pattern`` (as
       another engine of the host matches a profile's pattern); inside, the wrapper's engine.
    2. SIGTERM: the drain ends the wrapper's engine only; the neighbour received nothing and
       runs on, and the wrapper's log never warned about it (scans and the kill's discovery
       both saw it, outside the wrapper's tree)."""
    neighbour_dir = tmp_path / "neighbour-engine-7f3a"
    neighbour_dir.mkdir()
    neighbour = janitor.spawn([sys.executable, "-m", "tests.init.recorder", str(neighbour_dir)],
                              service=True)
    wait_for(lambda: (neighbour_dir / "ready.json").exists(), what="the neighbour ready")
    inside = tmp_path / "inside"
    inside.mkdir()
    wrapper = start_wrapper(janitor, tmp_path / "wrapper", [
        sys.executable, "-m", "tests.init.recorder", str(inside)],
        "--adopt-pattern", "neighbour-engine-7f3a", "--log-level", "debug")
    ready = wait_for(lambda: (inside / "ready.json").exists() and json.loads(
        (inside / "ready.json").read_text()), what="the engine ready")
    wrapper.proc.send_signal(signal.SIGTERM)
    assert wrapper.wait() == 0, wrapper.log.read_text()
    record = json.loads((neighbour_dir / f"main-{neighbour.pid}.json").read_text())
    assert record["signals"] == [], record
    assert neighbour.poll() is None
    assert json.loads((inside / f"main-{ready['main']}.json").read_text())["exit_code"] == 0
    log = wrapper.log.read_text()
    assert f"not adopting: refusing to signal pid {neighbour.pid}" in log  # seen, at debug
    assert "WARNING coordinator.kill.adoption" not in log


def _drain_order_holds(found: dict[int, dict[str, Any]], main_pid: int) -> None:
    main = found[main_pid]
    children = [r for pid, r in found.items() if pid != main_pid]
    assert children, found
    for record in found.values():
        assert record["signal"] == "SIGTERM", record
        assert record["cleanup"] == "finished", record
        assert record["exit_code"] == 0, record
    # Every child had its signal, and ended, before the main process was signalled.
    assert all(r["ended_at"] <= main["signalled_at"] for r in children), found
    assert main["sigkilled_children"] == []


def test_the_stop_signal_runs_the_drain_and_the_stream_is_handed_back(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Run the SGLang-shaped engine (graceful main process) under the wrapper, registered
       through ``worker_client`` with the URL the wrapper put in its environment; hold a
       stream in flight after 5 tokens.
    2. SIGTERM to the wrapper, as a runtime stops a container.
    3. The stream ends with its hand-back (the tokens already streamed), not cut; the test,
       as a router would, acknowledges it (it continues the request elsewhere).
    4. Every process ran its cleanup and exited 0, the children before the main process was
       signalled; nothing is left; the wrapper exits 0 and its last line says the drain was
       graceful, every process exited."""
    knobs = EngineKnobs(**{**SIM.__dict__, "hold_after_tokens": 5})
    wrapper = start_wrapper(janitor, tmp_path, sim_command(tmp_path, knobs, register=True))
    ready = sim_ready(tmp_path, wrapper)
    wait_for(lambda: wrapper.status()["workers"], what="the engine registered")
    stream = Stream(ready["url"], "Hand me back:", 50)
    while len(stream.chunks) < 5:
        assert stream._read_chunk()
    wrapper.proc.send_signal(signal.SIGTERM)
    stream.read_to_end()
    assert not stream.done
    assert stream.chunks[-1].get("handed_back") is True, stream.chunks[-1]
    assert stream.chunks[-1]["tokens"] == 5
    # What a router does with a handed-back request: continue it elsewhere, and say so.
    acked = httpx.post(wrapper.url() + "/migrations/ack", timeout=30,
                       json={"request_ids": [stream.chunks[-1]["request_id"]]}).json()
    assert acked["acked"] == [stream.chunks[-1]["request_id"]]
    assert wrapper.wait() == 0, wrapper.log.read_text()
    found = records(tmp_path)
    assert sorted(found) == sorted(p["pid"] for p in ready["processes"])
    _drain_order_holds(found, ready["pid"])
    assert _alive(list(found)) == []
    summary = wrapper.summary()
    assert summary["drain"] == "graceful"
    assert summary["exited"] == "4"
    assert summary["children_left"] == "0"


def test_a_stock_engine_that_sigkills_itself_is_reported_as_it_ended(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Run the engine as stock SGLang is (its main process SIGKILLs its tree and itself on
       SIGTERM), registered, so its children are stopped first and clean up.
    2. SIGTERM to the wrapper. The children ran their cleanup and exited 0; the main process
       SIGKILLed itself: the wrapper exits 137 and says so, never 0."""
    knobs = EngineKnobs(schedulers=2, watchdog=True, teardown_s=0.2)
    wrapper = start_wrapper(janitor, tmp_path, sim_command(tmp_path, knobs, register=True))
    ready = sim_ready(tmp_path, wrapper)
    wait_for(lambda: wrapper.status()["workers"], what="the engine registered")
    wrapper.proc.send_signal(signal.SIGTERM)
    assert wrapper.wait() == 128 + signal.SIGKILL, wrapper.log.read_text()
    found = records(tmp_path)
    for pid, record in found.items():
        if pid != ready["pid"]:
            assert (record["cleanup"], record["exit_code"]) == ("finished", 0), record
    summary = wrapper.summary()
    assert summary["main"] == "killed by SIGKILL"
    assert summary["drain"] != "graceful"


def test_a_second_stop_signal_escalates(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Run the engine whose main process ignores SIGTERM, no child watchdog, a 60 s tier.
    2. SIGTERM: the drain stops the children, then signals the main process, which notes it
       and carries on.
    3. A second SIGTERM: the main process is SIGKILLed now, not after its tier; the wrapper
       exits 137 and counts both signals."""
    knobs = EngineKnobs(schedulers=1, watchdog=False, graceful_main=True,
                        ignore_sigterm=("main",))
    wrapper = start_wrapper(janitor, tmp_path, sim_command(tmp_path, knobs),
                            "--tier-timeout", "60", "--grace-period", "120")
    ready = sim_ready(tmp_path, wrapper)
    main_pid = ready["pid"]
    wrapper.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM" in records(tmp_path)[main_pid]["signals"],
             what="the main process noting its SIGTERM")
    wrapper.proc.send_signal(signal.SIGTERM)
    assert wrapper.wait() == 128 + signal.SIGKILL, wrapper.log.read_text()
    main = records(tmp_path)[main_pid]
    assert main["ended_at"] is None  # killed: it never wrote its end
    summary = wrapper.summary()
    assert summary["stop_signals"] == "2"
    assert summary["main"] == "killed by SIGKILL"


def test_a_crash_ends_the_wrapper_and_what_the_engine_left(janitor: ProcessJanitor,
                                                             tmp_path: Path) -> None:
    """1. Run the engine with a scheduler that starts a daemon (double fork and ``setsid``:
       reparented to the wrapper, no PDEATHSIG, only SIGTERM ends it).
    2. SIGKILL the engine's main process from outside, before any drain: its PDEATHSIG
       children die with it.
    3. The daemon is ended by the wrapper's ordered kill (it records SIGTERM and finishes
       its cleanup); the wrapper exits 137, the main process's status; nothing is left."""
    knobs = EngineKnobs(schedulers=1, watchdog=False, daemonize=("scheduler",))
    wrapper = start_wrapper(janitor, tmp_path, sim_command(tmp_path, knobs))
    ready = sim_ready(tmp_path, wrapper)
    daemon = next(p["pid"] for p in ready["processes"] if p["role"] == "daemon")
    wait_for(lambda: any(pid == daemon for pid, _ in _children(wrapper.pid)),
             what="the daemon reparented to the wrapper")
    os.kill(ready["pid"], signal.SIGKILL)
    assert wrapper.wait() == 128 + signal.SIGKILL, wrapper.log.read_text()
    record = records(tmp_path)[daemon]
    assert record["signal"] == "SIGTERM", record
    assert record["cleanup"] == "finished", record
    assert _alive([p["pid"] for p in ready["processes"]]) == []
    summary = wrapper.summary()
    # The daemon, and the PDEATHSIG children when the wrapper looked before their SIGKILL
    # had ended them.
    assert summary["drain"] is None
    assert int(summary["leftovers"]) >= 1
    assert f"pid={daemon} " in wrapper.log.read_text()


def test_a_group_signal_from_outside_still_gives_the_ordered_kill(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Run the SGLang-shaped engine under the wrapper, registered (its pre-kill hook stands
       its child watchdog down), the wrapper leading the process group the test started it
       in (as a shell's job, or a unit's main process).
    2. ``kill -TERM -PGID`` of that group from outside.
    3. Only the wrapper is in that group: the engine's processes were not signalled by it;
       the drain signals the children first and the main process last, each cleans up and
       exits 0; the wrapper exits 0."""
    wrapper = start_wrapper(janitor, tmp_path, sim_command(tmp_path, SIM, register=True))
    ready = sim_ready(tmp_path, wrapper)
    wait_for(lambda: wrapper.status()["workers"], what="the engine registered")
    pgid = os.getpgid(wrapper.pid)
    assert pgid == wrapper.pid
    for process in ready["processes"]:
        assert os.getpgid(process["pid"]) != pgid
    os.killpg(pgid, signal.SIGTERM)
    assert wrapper.wait() == 0, wrapper.log.read_text()
    found = records(tmp_path)
    _drain_order_holds(found, ready["pid"])
    assert all(r["signals"] == ["SIGTERM"] for r in found.values()), found


def test_orphans_are_reaped_while_the_engine_runs(janitor: ProcessJanitor,
                                                   tmp_path: Path) -> None:
    """1. The command leaves three orphans (each started by a subshell that exits at once),
       which exit a moment later, reparented to the wrapper (a subreaper); then it waits.
    2. Each orphan is gone from ``/proc`` entirely: reaped, no zombie; the wrapper's only
       child is the command.
    3. SIGTERM: the wrapper exits 0 and counts every process it reaped."""
    script = ("for i in 1 2 3; do (sleep 0.2 & echo $! >> \"$1\"); done; "
              "trap 'exit 0' TERM; while :; do sleep 1; done")
    orphans = tmp_path / "orphans"
    wrapper = start_wrapper(janitor, tmp_path, ["sh", "-c", script, "sh", str(orphans)])
    pids = wait_for(lambda: orphans.exists() and len(
        lines := orphans.read_text().split()) == 3 and [int(p) for p in lines],
        what="three orphans started")
    wait_for(lambda: not [p for p in pids if Path(f"/proc/{p}").exists()],
             what="every orphan reaped")
    assert [state for _, state in _children(wrapper.pid) if state in ("Z", "X")] == []
    wrapper.proc.send_signal(signal.SIGTERM)
    assert wrapper.wait() == 0, wrapper.log.read_text()
    assert int(wrapper.summary()["reaped"]) >= 4


def test_the_stop_signal_is_checked_before_anything_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--stop-signal`` takes a name or a number of a signal the wrapper can catch; another
    (SIGKILL, SIGCHLD) is refused with the usage code before the command starts."""
    from coordinator.cli import main
    from coordinator.init.lifecycle import parse_signal

    assert parse_signal("SIGINT") == parse_signal("INT") == parse_signal("2") == signal.SIGINT
    assert main(["run", "--stop-signal", "SIGKILL", "--", "true"]) == exit_codes.USAGE
    assert "SIGKILL cannot be the stop signal" in capsys.readouterr().err
    assert main(["run", "--stop-signal", "nope", "--", "true"]) == exit_codes.USAGE
