"""worker_client's public surface and its shape, and the continuation layer's (router_client's
continuation modules, the continuation proxy): small modules, and imports that keep each on
its side. That the clients import nothing of the service (every module, in a fresh
interpreter with the service's dependencies blocked) is tests/test_layering.py's."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import continuation_proxy
import router_client
import worker_client
from tests.test_layering import _violations
from worker_client import errors

PACKAGE = Path(worker_client.__file__).parent

PUBLIC = {
    "WorkerClient", "install_graceful_shutdown", "GracefulShutdown", "Request", "TrackScope",
    "DrainNotice", "DrainObserver", "Tier", "handed_back_event", "process_start_time",
    "WorkerClientError", "InvalidSetting", "HandedBack", "ClientClosed", "NotRegistered",
    "CoordinatorError", "CoordinatorUnreachable", "StreamEnded", "ProtocolError",
    "CoordinatorRefused", "WorkerUnknown",
}
MAX_MODULE_LINES = 400
MAX_FACADE_LINES = 300


def test_public_surface() -> None:
    """1. ``__all__`` is exactly the names above (a new public name is a decision).
    2. Every one exists; every other module is private (``_name``) but ``errors``."""
    assert set(worker_client.__all__) == PUBLIC
    for name in worker_client.__all__:
        assert hasattr(worker_client, name), name
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert {m for m in modules if not m.startswith("_")} == {"errors"}


def test_every_exception_derives_from_the_base() -> None:
    """1. Every exception class of the package (public or not) is a WorkerClientError.
    2. Every one is drawn in the errors module's docstring."""
    classes: dict[str, type[BaseException]] = {}
    for path in PACKAGE.glob("*.py"):
        module = importlib.import_module(f"worker_client.{path.stem}")
        classes |= {obj.__qualname__: obj for obj in vars(module).values()
                    if inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__.startswith("worker_client")}
    assert "WorkerUnknown" in classes
    for name, cls in classes.items():
        assert issubclass(cls, errors.WorkerClientError), name
        drawn = f"── {name} " in (errors.__doc__ or "") or cls is errors.WorkerClientError
        assert drawn, name
    assert issubclass(errors.InvalidSetting, ValueError)  # callers catching ValueError


def test_modules_stay_small() -> None:
    """1. No module past MAX_MODULE_LINES; the client class's module under MAX_FACADE_LINES."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert max(sizes.values()) <= MAX_MODULE_LINES, sizes
    assert sizes["_client.py"] < MAX_FACADE_LINES, sizes["_client.py"]


def test_no_http_library_is_loaded() -> None:
    """1. In a fresh interpreter, import worker_client and build a client.
    2. No HTTP library (httpx, httpcore, h11, anyio) was loaded: the transport is the
    standard library's sockets."""
    assert _loaded_by("import worker_client; worker_client.WorkerClient(None)",
                      {"httpx", "httpcore", "h11", "anyio", "requests", "urllib3"}) == []


def _loaded_by(code: str, watched: set[str]) -> list[str]:
    """The packages of ``watched`` that running ``code`` in a fresh interpreter loads."""
    probe = (f"import json, sys; {code}; "
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent)
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return sorted(set(loaded) & watched)


# -- the router side's continuation layer: router_client's new modules and the proxy.

ROUTER_CLIENT = Path(router_client.__file__).parent
PROXY = Path(continuation_proxy.__file__).parent
CONTINUATION = {"ContinuingClient", "ContinuationStats", "RetryPolicy", "Refusal",
                "InvalidRequest", "UpstreamRejected", "StreamFailed"}


def test_the_continuation_layer_is_public_and_small() -> None:
    """1. router_client exports the continuation layer's names.
    2. No module of router_client or continuation_proxy is past MAX_MODULE_LINES."""
    assert set(router_client.__all__) >= CONTINUATION
    for name in CONTINUATION:
        assert hasattr(router_client, name), name
    sizes = {p.name: len(p.read_text().splitlines())
             for p in [*ROUTER_CLIENT.glob("*.py"), *PROXY.glob("*.py")]}
    assert max(sizes.values()) <= MAX_MODULE_LINES, sizes


def test_the_continuation_client_loads_no_web_framework() -> None:
    """1. In a fresh interpreter, import router_client.continuation and build a client.
    2. Neither a web framework (Starlette, uvicorn, FastAPI) nor anything of coordinator,
       worker_client or devstack was loaded: an application's own process can use it."""
    assert _loaded_by("import router_client as c; c.ContinuingClient('http://x')",
                      {"starlette", "uvicorn", "fastapi", "coordinator", "worker_client",
                       "devstack"}) == []


def test_the_proxy_imports_neither_the_service_nor_the_engine_side() -> None:
    """1. Parse every module of continuation_proxy (tests/test_layering.py's reader: imports
       at any depth, import_module, ``-m`` argv).
    2. None imports coordinator, devstack or worker_client."""
    assert not _violations(("continuation_proxy",), ("coordinator", "devstack",
                                                     "worker_client"))
