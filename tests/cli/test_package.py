"""The command line's package: what its commands take from the service, what parsing a client
command loads, and the console script's target."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from importlib import import_module
from pathlib import Path

from coordinator.cli import main

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "coordinator" / "cli"
SERVICE_SURFACE = {
    "coordinator.service.client",  # the HTTP client: drain, status
    "coordinator.service.render",  # text for people: drain, status, kill
    "coordinator.service.posture",  # the security check serve refuses with before it listens
    "coordinator.service.server",  # the server start: serve
}
"""The service modules a command may import: its public surface, never its runtime."""
SLOW_TO_IMPORT = ("coordinator.service", "fastapi", "starlette", "uvicorn", "psutil", "httpx")
"""What ``drain`` and ``status`` (the preStop hook's path) must not load to parse their
flags: the service and its dependencies, imported by a command only when it runs."""


def _service_imports(path: Path) -> set[str]:
    """Every ``coordinator.service`` module ``path`` imports, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "coordinator.service":
            names.update(f"coordinator.service.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return {name for name in names if name.startswith("coordinator.service")}


def test_commands_import_only_the_service_public_surface() -> None:
    """1. Parse every module of coordinator/cli.
    2. The service modules they import (inside functions too) are the client, the renderers,
       the posture check and the server start; nothing deeper."""
    used: dict[str, list[str]] = {}
    for path in sorted(CLI.glob("*.py")):
        for name in _service_imports(path):
            used.setdefault(name, []).append(path.name)
    assert used.keys() <= SERVICE_SURFACE, used
    assert "coordinator.service.client" in used  # the check sees the lazy imports


def test_parsing_a_client_command_loads_neither_the_service_nor_its_dependencies() -> None:
    """1. In a fresh interpreter, build the parser and parse a ``drain`` and a ``status``
       command line.
    2. None of the service package, FastAPI, Starlette, uvicorn, psutil or httpx is loaded."""
    code = (
        "import json, sys\n"
        "from coordinator.cli import build_parser\n"
        "parser = build_parser()\n"
        "parser.parse_args(['drain', '--quiet', '--deadline', '5'])\n"
        "parser.parse_args(['status', '--watch', '--json'])\n"
        f"slow = {SLOW_TO_IMPORT!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "                        if any(m == s or m.startswith(s + '.') for s in slow))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_console_script_is_the_cli_main() -> None:
    """1. Read ``shutdown-coordinator``'s target from pyproject.toml.
    2. It names ``coordinator.cli.main``, the function ``python -m coordinator`` runs."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["shutdown-coordinator"].partition(":")
    assert getattr(import_module(module), name) is main
    assert import_module("coordinator.__main__").main is main
