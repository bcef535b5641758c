"""A real headless Chromium, driven through its DevTools protocol over a pipe.

``--remote-debugging-pipe`` makes Chromium read commands from its fd 3 and write answers
and events to its fd 4, each message JSON ended by a NUL byte: no port, no websocket
library. ``Browser`` starts it (through the janitor, which ends it if the test does not),
opens a page, records what the page did (console messages, exceptions, log entries,
network requests) and closes Chromium with ``Browser.close``, waiting for it to exit.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.processes import ProcessJanitor

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
"""Debian's package ``chromium`` installs the first (``scripts/test.sh`` installs it)."""
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--no-default-browser-check", "--disable-extensions",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-pipe")
"""Headless, as root in a container (no sandbox), and quiet: nothing reaches the network
but what a page asks for."""
ANSWER_S = 30.0
"""Bound on waiting for one answer or event (only a failing test waits that long)."""


def chromium() -> str | None:
    for path in CHROMIUM_PATHS:
        if Path(path).exists():
            return path
    return shutil.which("chromium")


class Browser:
    """One Chromium; ``open`` a page, ``evaluate`` in it, ``screenshot`` it, ``close``."""

    def __init__(self, janitor: ProcessJanitor, profile: Path,
                 flags: tuple[str, ...] = ()) -> None:
        binary = chromium()
        assert binary is not None, "chromium is not installed (apt-get install chromium)"
        commands_r, self._commands = os.pipe()
        self._answers, answers_w = os.pipe()
        # bash places the pipes on fds 3 and 4, where Chromium looks for them.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{commands_r} 4>&{answers_w} '
             f"{commands_r}<&- {answers_w}>&-", binary, *FLAGS, *flags,
             f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(commands_r, answers_w), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        janitor.adopt(self.proc.pid)
        os.close(commands_r)
        os.close(answers_w)
        self._ids = itertools.count(1)
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    # --- the protocol -----------------------------------------------------------------------

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        """Send a command and return its result (events read meanwhile are kept)."""
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == number:
                assert "error" not in answer, f"{method}: {answer['error']}"
                result: dict[str, Any] = answer.get("result", {})
                return result
            self.events.append(answer)

    def wait_event(self, method: str, session: str | None = None) -> dict[str, Any]:
        """The first event ``method`` (of ``session``) not consumed yet."""
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    self.events.remove(event)
                    params: dict[str, Any] = event.get("params", {})
                    return params
            seen = len(self.events)
            self.events.append(self._read())

    def read_event(self) -> None:
        """Wait for the next message and keep it with the events."""
        self.events.append(self._read())

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + ANSWER_S
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._answers], [], [], max(left, 0))
            assert ready, f"Chromium did not answer within {ANSWER_S}s"
            chunk = os.read(self._answers, 1 << 20)
            assert chunk, "Chromium closed its DevTools pipe"
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        data: dict[str, Any] = json.loads(message)
        return data

    # --- pages ------------------------------------------------------------------------------

    def open(self, url: str, headers: dict[str, str] | None = None,
             width: int = 1280, height: int = 800) -> Page:
        """Open ``url`` in a new tab (with extra request ``headers``) and wait for its load
        event; what it logged and requested is recorded from before the navigation."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                  "deviceScaleFactor": 1, "mobile": False}, session)
        if headers:
            self.send("Network.setExtraHTTPHeaders", {"headers": headers}, session)
        self.send("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        return Page(self, session)

    def close(self) -> None:
        """``Browser.close``, then wait for Chromium (and so its helpers) to exit."""
        try:
            if self.proc.poll() is None:
                self.send("Browser.close")
        except AssertionError:
            pass  # it went away while answering
        finally:
            self.proc.wait(timeout=ANSWER_S)
            os.close(self._commands)
            os.close(self._answers)


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` evaluated in the page."""
        result = self.browser.send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True},
            self.session)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def events(self, *methods: str) -> list[dict[str, Any]]:
        return [e["params"] for e in self.browser.events
                if e.get("sessionId") == self.session and e.get("method") in methods]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (a resource that failed
        to load, a Content-Security-Policy violation) of this page."""
        found = [json.dumps(e)[:500] for e in self.events("Runtime.exceptionThrown")]
        found += [json.dumps(e)[:500] for e in self.events("Runtime.consoleAPICalled")
                  if e.get("type") in ("error", "assert", "warning")]
        found += [json.dumps(e)[:500] for e in self.events("Log.entryAdded")
                  if e.get("entry", {}).get("level") in ("error", "warning")]
        found += [json.dumps(e)[:500] for e in self.events("Network.loadingFailed")]
        return found

    def requests(self) -> list[str]:
        """Every URL the page requested."""
        return [e["request"]["url"] for e in self.events("Network.requestWillBeSent")]

    def screenshot(self) -> bytes:
        """A PNG of the whole page."""
        size = self.browser.send("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
        shot = self.browser.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                     "scale": 1}}, self.session)
        return base64.b64decode(shot["data"])
