"""The bearer token: checked on every call but ``/healthz``, ``/readyz`` and ``/metrics`` (by
``coordinator.service.request_guard``), and reread when its file changes.

The token travels as its UTF-8 bytes and is compared with the header's bytes as sent, so a
token in any script works from any client that sends UTF-8 (curl, Go's kubelet, httpx with
``shutdown_wire.bearer_header_bytes``). A token whose characters all fit latin-1 is also
taken as latin-1 bytes: Python's ``http.client`` (``urllib``) writes headers that way.

``TokenFile`` follows ``--token-file``: the coordinator looks at the file once a second (its
device, inode, size and modification time; a Kubernetes Secret's update swaps a symlink, a
new inode), and, on a rejected request, at once (one ``stat``, against the HTTP parsing the
request cost already), so a rotated token works from its first request and the old one stops
within a second. A file that turns
empty, unreadable or not UTF-8 (or is deleted) does not turn authentication off nor lock
everyone out: the last token stays in force, the error is logged at every change and shown
in ``/status`` ``security.token_file``.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shutdown_wire import BEARER

log = logging.getLogger(__name__)

SCHEME = BEARER.lower() + " "
"""Compared without regard to case."""
SCHEME_BYTES = SCHEME.encode()
CHECK_EVERY_S = 1.0
"""How often the token file is looked at."""


def token_bytes(token: str) -> tuple[bytes, ...]:
    """The byte forms a client may send ``token`` in: UTF-8, and latin-1 where it fits."""
    forms = [token.encode("utf-8")]
    try:
        latin = token.encode("latin-1")
    except UnicodeEncodeError:
        latin = forms[0]
    if latin != forms[0]:
        forms.append(latin)
    return tuple(forms)


class TokenFile:
    """The token in force: from ``--token-file`` (reread on change) or fixed."""

    def __init__(self, token: str | None, path: Path | None) -> None:
        self.path = path if token is not None else None
        self._forms = token_bytes(token) if token is not None else None
        self._signature = self._stat() if self.path is not None else None
        self.reloads = 0
        self.loaded_at = time.time()
        self.error: str | None = None
        self.listeners: list[Callable[[str], None]] = []
        """Called with the new token after each reload (outgoing calls that carry it)."""

    @property
    def enabled(self) -> bool:
        return self._forms is not None

    def forms(self) -> tuple[bytes, ...] | None:
        return self._forms

    def status(self) -> dict[str, Any] | None:
        """``/status`` ``security.token_file``: never the token."""
        if self.path is None:
            return None
        return {"path": str(self.path), "loaded_at": self.loaded_at, "reloads": self.reloads,
                "error": self.error}

    def check(self) -> bool:
        """Look at the file; reload the token when the file changed. Whether it changed."""
        if self.path is None:
            return False
        signature = self._stat()
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self._keep(f"cannot be read ({exc})")
            return False
        token = text.strip()
        if not token:
            self._keep("is empty")
            return False
        forms = token_bytes(token)
        if forms == self._forms:
            self.error = None
            return False
        self._forms = forms
        self.reloads += 1
        self.loaded_at = time.time()
        self.error = None
        log.warning("--token-file %s changed: the new token is in force, the old one is not",
                    self.path)
        for listener in self.listeners:
            try:
                listener(token)
            except Exception:
                log.exception("telling a client of the new token failed")
        return True

    def _keep(self, why: str) -> None:
        self.error = f"--token-file {self.path} {why}: the last token read stays in force"
        log.error("%s", self.error)

    def _stat(self) -> tuple[int, ...] | None:
        assert self.path is not None
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class TokenCheck:
    """With no token configured it lets everything through."""

    def __init__(self, source: TokenFile) -> None:
        self.source = source

    @property
    def enabled(self) -> bool:
        return self.source.enabled

    def accepts(self, header: bytes | None) -> bool:
        """Whether an ``Authorization`` header value (its bytes as sent) carries the token
        (or none is needed). A rejected one is tried again once the file has been looked
        at, so a token just rotated in works from its first request."""
        if not self.source.enabled:
            return True
        if self._matches(header):
            return True
        return self.source.check() and self._matches(header)

    def _matches(self, header: bytes | None) -> bool:
        forms = self.source.forms()
        if forms is None:
            return True
        header = header or b""
        given = (header[len(SCHEME):].strip() if header[:len(SCHEME)].lower() == SCHEME_BYTES
                 else b"")
        if not given:
            return False
        # compare_digest on bytes: constant time in the token's length, whatever is given.
        found = False
        for form in forms:
            found |= hmac.compare_digest(given, form)
        return found
