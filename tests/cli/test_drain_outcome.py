"""``drain``'s exit code, causes and warning for each outcome, and their human rendering.

A stand-in coordinator on a loopback socket answers ``POST /drain`` and ``GET /status`` with
a finished drain's summary, so every outcome word can be checked without producing it with
real processes (the drain's judgement itself is tested in tests/drain/test_outcome.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from coordinator import exit_codes
from coordinator.cli import main
from coordinator.drain.outcome import OUTCOMES
from coordinator.service.render import drain_verdict, progress_line, status_text

CAUSES = {
    "signalled": ["Main process sglang (pid 41) died of SIGKILL (exit -9; its container "
                  "reports 137), not of the SIGTERM it was sent, so its exit-time cleanup did "
                  "not run."],
    "lost_requests": ["2 handed-back requests expired unacknowledged: no router said it "
                      "continued them before the drain ended, so their clients were cut off "
                      "unless one did later."],
    "nothing_to_drain": ["No process was registered or adopted, so the drain ended nothing."],
}


def summary(outcome: str, *, causes: list[str] | None = None, lost: int = 0) -> dict[str, Any]:
    """A finished drain's ``/status`` document carrying ``drain.outcome/causes/lost_requests``."""
    processes = [] if outcome == "nothing_to_drain" else [
        {"pid": 41, "name": "sglang", "fate": "exited", "exit_code": -9, "signal": "SIGTERM",
         "elapsed_ms": 3.0, "role": "worker"}]
    return {
        "phase": "serving" if outcome == "aborted" else "done", "generation": 7,
        "outcome": outcome,
        "drain": {"reason": "test", "started_at": 1.0, "deadline_at": 2.0, "outcome": outcome,
                  "causes": causes if causes is not None else CAUSES.get(outcome, []),
                  "lost_requests": lost},
        "workers": [], "migrations": [], "processes": processes,
        "counts": {"exited": len(processes)},
    }


class _Coordinator(BaseHTTPRequestHandler):
    document: dict[str, Any] = {}

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"phase": "draining", "generation": 6, "joined": False})

    def do_GET(self) -> None:
        self._answer(self.document)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def coordinator() -> Iterator[tuple[str, type[_Coordinator]]]:
    """A stand-in coordinator; set ``handler.document`` to what ``/status`` answers."""
    handler = type("Handler", (_Coordinator,), {"document": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("word", sorted(OUTCOMES))
def test_drain_exits_with_the_outcomes_code_and_prints_its_causes(
    word: str, coordinator: tuple[str, type[_Coordinator]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """1. The stand-in's summary says ``word``; 2. `drain --quiet` exits with its code;
    3. the summary printed names the outcome and each of its causes."""
    url, handler = coordinator
    handler.document = summary(word)
    assert main(["drain", "--url", url, "--quiet"]) == exit_codes.OUTCOME_CODES[word]
    out = capsys.readouterr().out
    assert f"outcome     {word}" in out
    for cause in CAUSES.get(word, []):
        assert f"cause       {cause}" in out


def test_only_graceful_exits_0() -> None:
    assert [w for w in OUTCOMES if exit_codes.OUTCOME_CODES[w] == exit_codes.OK] == ["graceful"]


@pytest.mark.parametrize("as_json", [False, True])
def test_nothing_to_drain_warns_on_stderr(
    as_json: bool, coordinator: tuple[str, type[_Coordinator]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A drain that ended nothing: a warning on stderr even with --quiet and --json; stdout
    keeps the summary alone (valid JSON with --json)."""
    url, handler = coordinator
    handler.document = summary("nothing_to_drain")
    flags = ["--json"] if as_json else []
    assert main(["drain", "--url", url, "--quiet", *flags]) == exit_codes.NOTHING_TO_DRAIN
    captured = capsys.readouterr()
    assert "warning: nothing to drain: No process was registered or adopted" in captured.err
    if as_json:
        assert json.loads(captured.out)["drain"]["outcome"] == "nothing_to_drain"


def test_a_graceful_drain_warns_of_nothing(
    coordinator: tuple[str, type[_Coordinator]], capsys: pytest.CaptureFixture[str],
) -> None:
    url, handler = coordinator
    handler.document = summary("graceful")
    assert main(["drain", "--url", url, "--quiet"]) == exit_codes.OK
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "cause" not in captured.out
    assert "lost        0 requests" in captured.out


def test_an_outcome_the_cli_does_not_know_exits_survived(
    coordinator: tuple[str, type[_Coordinator]],
) -> None:
    """A newer coordinator's word: not 0, the most cautious code."""
    url, handler = coordinator
    handler.document = summary("something_new")
    assert main(["drain", "--url", url, "--quiet"]) == exit_codes.SURVIVED


def test_status_text_shows_causes_and_lost_requests() -> None:
    text = status_text(summary("lost_requests", lost=2))
    assert "outcome     lost_requests" in text
    assert f"cause       {CAUSES['lost_requests'][0]}" in text
    assert "lost        2 requests (handed back, expired unacknowledged)" in text


def test_status_text_of_a_document_without_the_new_keys() -> None:
    """An older coordinator: the top-level outcome only, no cause or lost lines."""
    document = summary("killed")
    document["drain"] = {"reason": "test", "started_at": 1.0, "deadline_at": 2.0}
    text = status_text(document)
    assert "outcome     killed" in text
    assert "cause " not in text
    assert "lost " not in text


def test_progress_line_ends_with_the_outcome_lost_count_and_causes() -> None:
    line = progress_line(summary("signalled", lost=1))
    assert "\n" not in line
    assert line.endswith(f"; outcome signalled, 1 request lost: {CAUSES['signalled'][0]}")
    assert "outcome" not in progress_line({**summary("graceful"), "outcome": None,
                                           "drain": {"deadline_at": None}})


def test_drain_verdict_reads_the_last_drain_after_an_abort() -> None:
    """Serving again after an abort: `drain` is null and `last_drain` holds the outcome."""
    document = {"phase": "serving", "outcome": None, "drain": None,
                "last_drain": {"outcome": "aborted", "causes": [], "lost_requests": 0}}
    assert drain_verdict(document) == ("aborted", [], 0)
    assert drain_verdict({"outcome": "timeout", "drain": {"outcome": "killed",
                                                          "causes": ["x"]}}) == (
        "timeout", ["x"], None)
