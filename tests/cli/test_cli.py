"""The command line: ``drain`` and ``status`` against a real coordinator, and exit codes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from coordinator import exit_codes
from coordinator.cli import main
from tests.kill.helpers import alive, start_tree
from tests.service.servers import FAST, ROOT, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "cli-token"


def _token_file(tmp_path: Path, token: str = TOKEN) -> str:
    path = tmp_path / "client.token"
    path.write_text(token)
    return str(path)


def test_drain_of_a_graceful_tree_exits_0_with_progress_and_summary(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator with a token and a registered tree;
    2. run `python -m coordinator drain --url ... --token-file ...` as a real process;
    3. it prints progress lines on stderr, the summary (naming every process) on stdout, and
       exits 0;
    4. that is what happened: every process ran its cleanup (its own record), nothing
       runs, every exit code its parent (or the test) saw is 0, and /status says so."""
    running = start_coordinator(janitor, tmp_path, *FAST, token=TOKEN)
    tree = start_tree(janitor, {"children": [{"children": [{}]}, {"children": [{}]}]},
                      tmp_path / "tree")
    register(running, tree.pid)
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "drain", "--url", running.url, "--token-file",
         _token_file(tmp_path), "--reason", "cli test"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == exit_codes.OK, done.stderr
    assert "[done]" in done.stderr
    assert "outcome     graceful" in done.stdout
    for pid in tree.pids():
        assert str(pid) in done.stdout
    with running.client() as client:
        status = client.get("/status").json()
    truth = assert_summary_is_true(status, tree, root_code=tree.root.wait(timeout=30))
    assert {(e.fate, e.exit_code) for e in truth.values()} == {("exited", 0)}


def test_drain_that_needed_sigkill_exits_killed(
    janitor: ProcessJanitor, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1. register a tree with a child that ignores SIGTERM; 2. `drain --json`;
    3. exit code KILLED; the stubborn child alone wrote no cleanup record and its parent saw
       it die of SIGKILL; the JSON summary agrees on every process and names that one
       killed."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, {"children": [{}, {"role": "stubborn", "ignore_term": True}]},
                      tmp_path / "tree")
    register(running, tree.pid)
    code = main(["drain", "--url", running.url, "--json", "--quiet"])
    assert code == exit_codes.KILLED
    summary = json.loads(capsys.readouterr().out)
    truth = assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=30))
    (stubborn,) = tree.pids("stubborn")
    assert [pid for pid, e in truth.items() if not e.cleanup] == [stubborn]
    assert truth[stubborn].exit_code == -9
    killed = [p["pid"] for p in summary["processes"] if p["fate"] == "killed"]
    assert killed == [stubborn]


def test_an_aborted_drain_exits_aborted(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a worker reports 1 in flight so the drain holds in migrating; 2. `drain` runs in a
    thread; 3. DELETE /drain; 4. the command exits ABORTED, and the tree still runs with
    no process signalled (none wrote its cleanup record)."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    tree = start_tree(janitor, {"children": [{}]}, tmp_path / "tree")
    worker = register(running, tree.pid)
    httpx.post(f"{running.url}/workers/{worker['id']}/report", json={"inflight": 1})
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(
        main(["drain", "--url", running.url, "--quiet"])))
    thread.start()
    wait_for(lambda: running.status()["phase"] == "migrating", what="migrating")
    assert httpx.delete(running.url + "/drain").status_code == 200
    thread.join(timeout=60)
    assert codes == [exit_codes.ABORTED]
    assert all(alive(pid) for pid in tree.pids())
    assert tree.markers() == {}
    tree.end()


def test_status_table_and_json(
    janitor: ProcessJanitor, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1. register a tree; 2. `status` prints a table naming the worker; 3. `status --json`
    prints the document."""
    running = start_coordinator(janitor, tmp_path, *FAST, token=TOKEN)
    tree = start_tree(janitor, {"children": [{}]}, tmp_path / "tree")
    worker = register(running, tree.pid, role="engine")
    token = ["--url", running.url, "--token-file", _token_file(tmp_path)]
    assert main(["status", *token]) == exit_codes.OK
    text = capsys.readouterr().out
    assert "phase       serving" in text
    assert worker["id"] in text
    assert "engine" in text
    assert main(["status", "--json", *token]) == exit_codes.OK
    assert json.loads(capsys.readouterr().out)["workers"][0]["id"] == worker["id"]
    tree.end()


def test_client_failures_have_their_own_exit_codes(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. wrong token → AUTH_FAILED; 2. nothing listening → UNREACHABLE; 3. bad flags →
    USAGE; 4. a serve setting out of range → USAGE."""
    running = start_coordinator(janitor, tmp_path, *FAST, token=TOKEN)
    wrong = _token_file(tmp_path, "wrong")
    assert main(["status", "--url", running.url, "--token-file", wrong]) == exit_codes.AUTH_FAILED
    assert main(["drain", "--url", running.url, "--token-file", wrong]) == exit_codes.AUTH_FAILED
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert main(["status", "--url", closed]) == exit_codes.UNREACHABLE
    assert main(["drain", "--bogus"]) == exit_codes.USAGE
    assert main([]) == exit_codes.USAGE
    assert main(["serve", "--grace-period", "-4"]) == exit_codes.USAGE


def test_demo_is_a_command_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    """1. ``shutdown-coordinator demo`` (the README's first command before the demo left the
       product) exits USAGE and names the command that runs it now, on stderr.
    2. The help lists no ``demo`` command."""
    assert main(["demo", "--streams", "4"]) == exit_codes.USAGE
    assert "shutdown-coordinator-demo" in capsys.readouterr().err
    assert main(["--help"]) == exit_codes.OK
    assert "demo" not in capsys.readouterr().out
