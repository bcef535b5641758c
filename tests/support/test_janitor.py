"""The janitor fails the test that leaves something behind, and only that test.

A pytest session of its own (in a subprocess, with this repository's ``janitor`` fixture)
runs tests that each leave something behind in another way, and clean ones; each leak must
fail its test in the teardown, naming the process, and every process must be gone after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.processes import ProcessJanitor

ROOT = Path(__file__).resolve().parents[2]

INNER = '''
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.processes import DOORBELL_PREFIX, wait_for

OUT = Path(os.environ["JANITOR_TEST_OUT"])
PY = sys.executable
ROOT = os.environ["JANITOR_TEST_ROOT"]
TERM_EXITS = "signal.signal(signal.SIGTERM, lambda *_: sys.exit({code}))"
READY = "print('ready', flush=True)"


def ticks(pid):
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[19])


def record(name, pid):
    """What the outer test checks is gone afterwards."""
    (OUT / f"{name}.json").write_text(json.dumps({"pid": pid, "ticks": ticks(pid)}))


def state(pid):
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()[0]


def python(janitor, code, **kwargs):
    """A Python child that says ``ready`` once its signal handlers are in place."""
    proc = janitor.spawn([PY, "-c", code], stdout=subprocess.PIPE, text=True, **kwargs)
    assert proc.stdout.readline() == "ready\\n"
    return proc


def test_leaky(janitor):
    record("leaky", janitor.spawn(["sleep", "600"]).pid)


def test_stubborn_service(janitor):
    code = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); {READY}; "
    proc = python(janitor, code + "time.sleep(600)", service=True, stop_within_s=1)
    record("stubborn", proc.pid)


def test_service_exit_code(janitor):
    code = f"import signal, sys, time; {TERM_EXITS.format(code=3)}; {READY}; time.sleep(600)"
    record("wrong_code", python(janitor, code, service=True).pid)


def test_escaped_grandchild(janitor):
    shell = janitor.spawn(["sh", "-c", "sleep 600 >/dev/null & echo $!"], stdout=subprocess.PIPE,
                          text=True)
    out, _ = shell.communicate(timeout=30)
    # The shell prints $! once it forked: until its child's exec, that child is a shell.
    wait_for(lambda: Path(f"/proc/{int(out)}/comm").read_text() == "sleep\\n",
             what="the grandchild's exec")
    record("grandchild", int(out))


def test_adopted_daemon(janitor):
    code = ("import os, sys, time\\n"
            "if os.fork(): sys.exit(0)\\n"
            "os.setsid()\\n"
            "if os.fork(): os._exit(0)\\n"
            "print(os.getpid(), flush=True)\\n"
            "time.sleep(600)\\n")
    proc = janitor.spawn([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    proc.wait(timeout=30)
    janitor.adopt(pid)
    record("daemon", pid)


def test_service_leaves_a_child(janitor):
    code = (f"import signal, subprocess, sys, time; {TERM_EXITS.format(code=0)}; "
            f"child = subprocess.Popen(['sleep', '600']); print(child.pid, flush=True); "
            f"time.sleep(600)")
    proc = janitor.spawn([PY, "-c", code], stdout=subprocess.PIPE, text=True, service=True)
    record("orphan", int(proc.stdout.readline()))
    record("orphan_service", proc.pid)


def test_unmanaged_child(janitor):
    record("unmanaged", subprocess.Popen(["sleep", "600"]).pid)


def test_killed_coordinator_leaves_its_doorbell(janitor, tmp_path):
    port = tmp_path / "port.json"
    proc = janitor.spawn([PY, "-m", "coordinator", "serve", "--port", "0", "--port-file",
                          str(port), "--log-level", "warning"], cwd=ROOT)
    bell = janitor.runtime_dir / f"{DOORBELL_PREFIX}{proc.pid}"
    wait_for(lambda: port.exists() and bell.exists(), what="the coordinator up")
    (OUT / "doorbell.txt").write_text(str(bell))
    proc.kill()
    proc.wait(timeout=30)


def test_assert_clean_fails_the_body(janitor):
    record("in_body", janitor.spawn(["sleep", "600"]).pid)
    janitor.assert_clean()


def test_clean(janitor):
    ended = janitor.spawn(["sleep", "600"])
    ended.terminate()
    ended.wait(timeout=30)
    zombie = janitor.spawn(["true"])
    wait_for(lambda: state(zombie.pid) == "Z", what="a zombie")
    code = f"import signal, sys, time; {TERM_EXITS.format(code=0)}; {READY}; time.sleep(600)"
    python(janitor, code, service=True)
    code = f"import signal, sys, time; {TERM_EXITS.format(code=4)}; {READY}; time.sleep(600)"
    python(janitor, code, service=True, exit_code=4)
    sleeper = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    record("clean_service", sleeper.pid)


def test_clean_coordinator(janitor, tmp_path):
    port = tmp_path / "port.json"
    proc = janitor.spawn([PY, "-m", "coordinator", "serve", "--port", "0", "--port-file",
                          str(port), "--log-level", "warning"], cwd=ROOT, service=True)
    bell = janitor.runtime_dir / f"{DOORBELL_PREFIX}{proc.pid}"
    wait_for(lambda: port.exists() and bell.exists(), what="the coordinator up")
    record("coordinator", proc.pid)
'''

EXPECTED_FAILURES = {
    "test_leaky": ("left running: pid {leaky} (sleep) `sleep 600` [started by the test]: "
                   "ended on SIGTERM"),
    "test_stubborn_service": "service pid {stubborn} `",
    "test_service_exit_code": "service pid {wrong_code} `",
    "test_escaped_grandchild": "left running: pid {grandchild} (sleep) `sleep 600` [in session",
    "test_adopted_daemon": "left running: pid {daemon} (python",
    "test_service_leaves_a_child": ("still running after the services stopped (of service pid "
                                    "{orphan_service}): pid {orphan} (sleep) `sleep 600`"),
    "test_unmanaged_child": ("left running: pid {unmanaged} (sleep) `sleep 600` [a child of the "
                             "test process, not started by the janitor]: ended on SIGTERM"),
    "test_killed_coordinator_leaves_its_doorbell": "left in the test's runtime directory: {bell}",
}
IN_THE_BODY = {
    "test_assert_clean_fails_the_body": "left running: pid {in_body} (sleep) `sleep 600`",
}
"""Tests whose ``janitor.assert_clean()`` fails them in their body (teardown is clean)."""
EXPECTED_DETAILS = {
    "test_stubborn_service": "still running 1 s after SIGTERM, SIGKILLed",
    "test_service_exit_code": "exited 3 on SIGTERM, expected 0",
    "test_adopted_daemon": "[adopted by the test]: ended on SIGTERM",
}


def _gone(pid: int, ticks: int) -> bool:
    """Per /proc: no process ``pid`` started at ``ticks`` runs (a zombie has ended)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[19]) != ticks or fields[0] in ("Z", "X")


def _outcomes(junit: Path) -> dict[str, str]:
    """Test name to ``passed`` or the text of its failure or error (teardown included)."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.attrib["name"]
        problems = [f"{e.tag}: {e.attrib.get('message', '')}\n{e.text or ''}"
                    for e in case if e.tag in ("failure", "error")]
        out[name] = "\n".join(problems) if problems else "passed"
    return out


def test_the_janitor_fails_each_leak_and_passes_clean_tests(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A pytest session of its own runs: a test that leaves a sleeper running; a service
       that ignores SIGTERM (1 s bound); a service that exits 3 on SIGTERM; a shell's
       grandchild left in the session the janitor started; a daemon (double fork, setsid)
       the test adopted; a service that exits 0 but leaves its child; a child the test
       started with ``subprocess.Popen``, not through the janitor; a coordinator killed
       by SIGKILL, whose doorbell pipe stays in the runtime directory; and two clean tests
       (processes ended and a zombie left unreaped; services that exit with the codes they
       declare; a coordinator stopped as a service, which removes its pipe); and a leak
       that ``janitor.assert_clean()`` reports in the test's body.
    2. Each leaky test errors in its teardown, naming the process by PID (or the pipe by
       path) and how it ended (the ``assert_clean`` one fails in its body instead, and only
       there); the clean tests pass.
    3. Every process the inner tests started is gone (per /proc), and the inner janitors
       left nothing to this test's janitor."""
    inner = tmp_path / "inner"
    out = tmp_path / "out"
    inner.mkdir()
    out.mkdir()
    (inner / "conftest.py").write_text("from tests.conftest import janitor  # noqa: F401\n")
    (inner / "test_inner.py").write_text(textwrap.dedent(INNER))
    junit = tmp_path / "junit.xml"
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p),
           "JANITOR_TEST_OUT": str(out), "JANITOR_TEST_ROOT": str(ROOT)}
    log = tmp_path / "inner.log"
    with log.open("wb") as handle:
        session = janitor.spawn(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
             "--timeout", "150", "--rootdir", str(inner), "--junitxml", str(junit),
             str(inner)],
            cwd=inner, env=env, stdout=handle, stderr=subprocess.STDOUT)
        code = session.wait(timeout=170)
    text = log.read_text()
    assert code == pytest.ExitCode.TESTS_FAILED, text
    pids = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    names = {name: info["pid"] for name, info in pids.items()}
    assert set(names) == {"leaky", "stubborn", "wrong_code", "grandchild", "daemon", "orphan",
                          "orphan_service", "unmanaged", "in_body", "clean_service",
                          "coordinator"}, names
    bell = (out / "doorbell.txt").read_text()
    outcomes = _outcomes(junit)
    assert set(outcomes) == {*EXPECTED_FAILURES, *IN_THE_BODY, "test_clean",
                             "test_clean_coordinator"}, text
    assert outcomes["test_clean"] == "passed", text
    assert outcomes["test_clean_coordinator"] == "passed", text
    for test, expected in EXPECTED_FAILURES.items():
        got = outcomes[test]
        assert got.startswith("error: failed on teardown"), (test, got)
        wanted = expected.format(bell=bell, **names)
        assert wanted in got, (test, wanted, got)
        assert EXPECTED_DETAILS.get(test, "") in got, (test, got)
    for test, expected in IN_THE_BODY.items():
        got = outcomes[test]
        assert got.startswith("failure: "), (test, got)
        assert "error: " not in got, (test, got)
        assert expected.format(**names) in got, (test, got)
    assert not Path(bell).exists()
    for name, info in pids.items():
        assert _gone(info["pid"], info["ticks"]), (name, info)


def test_a_spawned_process_shows_its_own_command_at_once(janitor: ProcessJanitor) -> None:
    """1. Spawn ``sleep 600`` 2,000 times; read each one's ``/proc/<pid>/cmdline`` as soon as
       ``spawn`` returns, then end it.
    2. Every one already shows ``sleep 600``: a leak found right after its start is
       described by its own command (``Popen`` alone returns mid-exec, when the cmdline is
       empty: some of 2,000 here, more on a loaded machine)."""
    shown = []
    for _ in range(2000):
        proc = janitor.spawn(["sleep", "600"])
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            shown.append(f.read())
        proc.kill()
        proc.wait()
    assert [c for c in shown if c != b"sleep\x00600\x00"] == []


def test_a_process_found_mid_exec_is_described_by_its_own_command(
    janitor: ProcessJanitor,
) -> None:
    """1. 2,000 times: start ``sleep 600`` with ``subprocess.Popen`` (a child of the test
       process the janitor did not start, as a test's or a service's own child is), and
       have the janitor find it as soon as ``Popen`` returns: mid-exec, most of the time,
       when ``/proc/<pid>/cmdline`` still reads empty. End it.
    2. Each one was found, as the test's own child, named ``sleep`` and described as
       ``sleep 600``: the janitor waits for the exec to lay the command line out before it
       reads it, where its failure message would otherwise show an empty command."""
    seen = []
    for _ in range(2000):
        proc = subprocess.Popen(["sleep", "600"])
        try:
            seen += [(f.name, f.cmdline, f.how) for f in janitor.leftovers(among=[proc.pid])]
        finally:
            proc.kill()
            proc.wait()
    expected = ("sleep", "sleep 600", "a child of the test process, not started by the janitor")
    assert len(seen) == 2000
    assert [s for s in seen if s != expected] == []
