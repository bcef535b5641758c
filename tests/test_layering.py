"""The layering of the packages, read from the source and tried in a fresh interpreter.

    coordinator      may import worker_client and router_client, never devstack
    worker_client    standard library, httpx and tenacity; never coordinator or devstack
    router_client    standard library and httpx; never coordinator or devstack
    shutdown_wire    the protocol's strings, for both clients; never coordinator or devstack
    devstack         the demo stack (simulated engine, local pods, load, reference router,
                     demo): may import all three, and is imported by none of them

Inside the coordinator: ``coordinator.group`` (the group drain) imports ``drain/`` and
``kill/`` but never ``service/`` nor the web framework (``service/`` wires it to HTTP), and
``drain/`` never imports ``group/`` (the controller knows groups only through its ports).

ruff's banned-api rule says the same at lint time (pyproject.toml, coordinator/ruff.toml);
this test also sees imports inside functions and modules named in ``import_module`` calls and
``python -m`` argv, and it imports every module of both clients (and of the wire module they
share) with the service's dependencies made unimportable.
"""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("coordinator", "worker_client", "router_client", "shutdown_wire",
           "continuation_proxy")
CLIENTS = ("worker_client", "router_client", "shutdown_wire")
"""What engines and routers import: the two clients and the wire module they share."""
DEMO_STACK = "devstack"
SERVICE_ONLY = ("coordinator", "devstack", "fastapi", "starlette", "uvicorn", "psutil",
                "pydantic")
"""What neither client may import: the service, the demo stack, and the service's
dependencies (an engine's Python has its own pins of them, or none)."""


def _modules(package: str) -> dict[str, Path]:
    """Every module of ``package`` by dotted name, found on disk (nothing is imported)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imported_names(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the module, at any depth: ``import``
    and ``from`` statements (relative ones resolved), ``importlib.import_module("…")`` and
    ``__import__("…")`` with a literal name, and ``"-m", "…"`` in a literal argv."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    names: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names.append((node.lineno, target))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (called in ("import_module", "__import__") and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)):
                names.append((node.lineno, first.value))
        elif isinstance(node, (ast.List, ast.Tuple)):
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            names += [(node.lineno, after) for flag, after in itertools.pairwise(items)
                      if flag == "-m" and isinstance(after, str)]
    return names


def _violations(packages: tuple[str, ...], banned: tuple[str, ...]) -> list[str]:
    found = []
    for package in packages:
        for module, path in _modules(package).items():
            for line, name in _imported_names(module, path):
                if name.split(".")[0] in banned:
                    found.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    return found


def test_the_product_never_imports_the_demo_stack() -> None:
    """1. Parse every module of coordinator, worker_client, router_client, shutdown_wire and
       continuation_proxy.
    2. None imports devstack, in any form, at any depth."""
    assert not _violations(PRODUCT, (DEMO_STACK,))


def test_the_proxy_imports_nothing_of_the_service_or_the_engine_side() -> None:
    """1. Parse every module of continuation_proxy.
    2. None imports coordinator, devstack or worker_client: it runs next to a router, with
       router_client and its web framework only."""
    assert not _violations(("continuation_proxy",),
                           ("coordinator", "devstack", "worker_client"))


def test_the_clients_import_nothing_of_the_service() -> None:
    """1. Parse every module of worker_client, router_client and shutdown_wire.
    2. None imports coordinator, devstack, FastAPI, Starlette, uvicorn, psutil or pydantic,
       not even inside a function."""
    assert not _violations(CLIENTS, SERVICE_ONLY)


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """1. Parse a module that imports devstack in each form the check knows.
    2. Every one is found, with its line.
    3. Relative imports resolve against the module (a module or a package's ``__init__``);
       one that climbs out of the top-level package resolves to nothing."""
    path = tmp_path / "probe.py"
    path.write_text("import devstack.sim\n"
                    "def f():\n"
                    "    from devstack import demo\n"
                    "    importlib.import_module('devstack.local_stack')\n"
                    "    return ['python', '-m', 'devstack.reference_router']\n")
    found = [(line, name) for line, name in _imported_names("coordinator.probe", path)
             if name.startswith(DEMO_STACK)]
    assert found == [(1, "devstack.sim"), (3, "devstack"), (4, "devstack.local_stack"),
                     (5, "devstack.reference_router")]
    path.write_text("from . import sse\nfrom .. import coordinator\n")
    assert _imported_names("router_client.watch", path) == [(1, "router_client"), (2, "")]
    package = tmp_path / "__init__.py"
    package.write_text("from .sse import parse\n")
    assert _imported_names("router_client", package) == [(1, "router_client.sse")]


_BLOCKING_IMPORT = """
import importlib, json, sys

BLOCKED = set(sys.argv[1].split(","))
tried = []

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            tried.append(name)
            raise ModuleNotFoundError(f"{name} is blocked in this test", name=name)
        return None

sys.meta_path.insert(0, Blocked())
importlib.import_module(sys.argv[2])
print(json.dumps({"tried": tried,
                  "loaded": sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)}))
"""


@pytest.mark.parametrize(
    "module", [m for package in CLIENTS for m in _modules(package)
               if not m.endswith("__main__")])
def test_every_client_module_imports_without_the_service(module: str) -> None:
    """1. Start a fresh interpreter whose first import finder refuses coordinator, devstack,
       FastAPI, Starlette, uvicorn, psutil and pydantic (and notes each attempt).
    2. Import the module there: it imports, without trying any of them (not even an import
       guarded by ``except ImportError``), and none of them is loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKING_IMPORT, ",".join(SERVICE_ONLY), module],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"tried": [], "loaded": []}, seen


GROUP = "coordinator.group"
GROUP_BANNED = ("coordinator.service", "fastapi", "starlette", "uvicorn")
"""What the group drain's package may not import: the service wires it to HTTP."""


def _inner_violations(package: str, banned: tuple[str, ...]) -> list[str]:
    found = []
    for module, path in _modules(package.replace(".", "/")).items():
        for line, name in _imported_names(module, path):
            if any(name == b or name.startswith(b + ".") for b in banned):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    return found


def test_the_group_drain_stays_below_the_service() -> None:
    """1. Parse every module of coordinator.group: none imports coordinator.service, FastAPI,
    Starlette or uvicorn. 2. Parse every module of coordinator.drain: none imports
    coordinator.group."""
    assert _modules("coordinator/group"), "coordinator/group has no modules"
    assert not _inner_violations(GROUP, GROUP_BANNED)
    assert not _inner_violations("coordinator.drain", (GROUP,))
