"""The client's settings that an engine may also give through its environment.

Each is a constructor argument of ``WorkerClient`` first; the variable is read only when the
argument is left out, so that a deployment can tune an engine it cannot edit. The
coordinator's address and token are the manifests' variables, the ones every pod gives its
engine container (``deploy/kubernetes/base/engine-deployment.yaml``) and the ``drain`` and
``status`` commands read.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from worker_client._drain import DrainObserver
from worker_client._scheduling import check_slice
from worker_client.errors import InvalidSetting

URL_ENV = "SHUTDOWN_COORDINATOR_URL"
"""The coordinator's URL (``http://127.0.0.1:PORT`` in a pod: its containers share one
network namespace); the constructor's ``coordinator_url`` wins over it, None included.
Unset: no coordinator (the engine serves, and a local drain still works)."""
TOKEN_FILE_ENV = "SHUTDOWN_COORDINATOR_TOKEN_FILE"
"""A file holding the bearer token (the Secret the pod mounts); read at construction."""
TOKEN_ENV = "SHUTDOWN_COORDINATOR_TOKEN"
"""The token itself, when no file is named; the constructor's ``token`` wins over both."""


class FromEnvironment:
    """The default of an argument that the environment may give (``FROM_ENVIRONMENT``):
    unlike None, which says "none"."""

    def __repr__(self) -> str:
        return "FROM_ENVIRONMENT"


FROM_ENVIRONMENT = FromEnvironment()


def coordinator_url(given: str | FromEnvironment | None,
                    environ: Mapping[str, str] = os.environ) -> str | None:
    if not isinstance(given, FromEnvironment):
        return given
    return environ.get(URL_ENV) or None


def token(given: str | FromEnvironment | None,
          environ: Mapping[str, str] = os.environ) -> str | None:
    if not isinstance(given, FromEnvironment):
        return given
    path = environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidSetting(f"{TOKEN_FILE_ENV}={path}: cannot read the token: {exc}"
                                 ) from exc
    return environ.get(TOKEN_ENV) or None


EVENT_READER_ENV = "WORKER_CLIENT_EVENT_READER"
"""``loop`` (the default: read the event stream on the engine's loop when there is one) or
``thread`` (always a reader thread); the constructor's ``event_reader`` wins over it."""
EVENT_READERS = ("loop", "thread")

LATENCY_SLICE_ENV = "WORKER_CLIENT_LATENCY_SLICE_US"
"""Microseconds; the constructor's ``latency_slice_us`` wins over it (see that argument)."""

DRAIN_OBSERVER_ENV = "WORKER_CLIENT_DRAIN_OBSERVER"
"""``module:callable``, a ``DrainObserver`` imported when the client is built, for a
benchmark that measures engines it does not construct (as ``PYTHONBREAKPOINT`` names a
debugger); the constructor's ``drain_observer`` wins over it. Unset: no observer."""


def event_reader(given: str | None, environ: Mapping[str, str] = os.environ) -> str:
    reader = given or environ.get(EVENT_READER_ENV) or "loop"
    if reader not in EVENT_READERS:
        raise InvalidSetting(f"event_reader must be one of {EVENT_READERS}, not {reader!r}")
    return reader


def latency_slice(given: int | None, environ: Mapping[str, str] = os.environ) -> int | None:
    if given is None and environ.get(LATENCY_SLICE_ENV):
        try:
            given = int(environ[LATENCY_SLICE_ENV])
        except ValueError as exc:
            raise InvalidSetting(f"{LATENCY_SLICE_ENV} must be an integer") from exc
    return None if given is None else check_slice(given)


def drain_observer(given: DrainObserver | None,
                   environ: Mapping[str, str] = os.environ) -> DrainObserver | None:
    if given is not None or not environ.get(DRAIN_OBSERVER_ENV):
        return given
    name = environ[DRAIN_OBSERVER_ENV]
    module, _, attr = name.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidSetting(f"{DRAIN_OBSERVER_ENV}={name!r}: {exc}") from exc
    if not callable(found):
        raise InvalidSetting(f"{DRAIN_OBSERVER_ENV}={name!r} is not callable")
    observer: DrainObserver = found
    return observer
