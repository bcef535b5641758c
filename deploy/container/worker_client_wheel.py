"""Build the engine side's wheel: ``worker_client`` and the wire strings it shares with the
coordinator (``shutdown_wire``, standard library only), pure Python.

An engine image needs ``worker_client`` and its two requirements in the engine's own Python,
not the coordinator's service dependencies (FastAPI, uvicorn, pydantic: each engine pins its
own). setuptools builds one distribution per ``pyproject.toml``, so this script writes the
wheel itself (the wheel format, PEP 427: a zip of the package plus ``METADATA``, ``WHEEL`` and
``RECORD``), taking the version, the Python requirement, the licence and the two requirements
from ``pyproject.toml``, where they are written once.

    python3 worker_client_wheel.py [--repo DIR] --out DIR

writes ``DIR/shutdown_coordinator_worker_client-<version>-py3-none-any.whl`` (the same bytes
for the same sources) and ``DIR/requirements.txt`` (the requirements, which the engine's
installer, ``install_into_engine.sh``, resolves against what the engine already has).
Used by ``deploy/container/Dockerfile`` (stage ``worker-wheel``). Standard library only,
Python 3.11+.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

DIST = "shutdown-coordinator-worker-client"
"""The distribution's name (``pip show`` and ``pip uninstall`` know it by this name)."""
PACKAGES = ("worker_client", "shutdown_wire")
"""What the wheel holds: the client and what it imports of the project."""
REQUIRES = ("tenacity",)
"""The third-party packages ``worker_client`` imports (tests/deploy checks its imports); their
version bounds are the project's, read from ``pyproject.toml``."""
ZIP_DATE = (1980, 1, 1, 0, 0, 0)
"""Every entry's timestamp: the same sources give the same wheel."""


def _name(requirement: str) -> str:
    """The normalized project name of a PEP 508 requirement string."""
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if found is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", found[1]).lower()


@dataclass(frozen=True)
class Metadata:
    """What the wheel says of itself, as ``pyproject.toml`` gives it."""

    version: str
    requires_python: str
    license: str
    requires: tuple[str, ...]


def metadata(repo: Path) -> Metadata:
    """Version, Python requirement, licence and requirements, from ``pyproject.toml``."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    dependencies = {_name(d): d for d in project.get("dependencies", [])}
    missing = [name for name in REQUIRES if name not in dependencies]
    if missing:
        raise SystemExit(f"pyproject.toml does not list {', '.join(missing)}")
    licence = project.get("license", {})
    return Metadata(
        version=str(project["version"]),
        requires_python=str(project.get("requires-python", "")),
        license=str(licence.get("text", "")) if isinstance(licence, dict) else str(licence),
        requires=tuple(dependencies[name] for name in REQUIRES),
    )


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build(repo: Path, out: Path) -> Path:
    """Write the wheel and ``requirements.txt`` into ``out``; return the wheel's path."""
    meta = metadata(repo)
    stem = f"{DIST.replace('-', '_')}-{meta.version}"
    dist_info = f"{stem}.dist-info"
    files: list[tuple[str, bytes]] = []
    for package in PACKAGES:
        for path in sorted((repo / package).rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
                continue
            files.append((path.relative_to(repo).as_posix(), path.read_bytes()))
        if not any(name == f"{package}/__init__.py" for name, _ in files):
            raise SystemExit(f"no {package}/__init__.py under {repo}")
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DIST}",
        f"Version: {meta.version}",
        "Summary: The engine side of shutdown-coordinator: register, follow the drain, hand "
        "requests back",
    ]
    if meta.requires_python:
        lines.append(f"Requires-Python: {meta.requires_python}")
    if meta.license:
        lines.append(f"License: {meta.license}")
    lines += [f"Requires-Dist: {r}" for r in meta.requires]
    files.append((f"{dist_info}/METADATA", ("\n".join(lines) + "\n").encode()))
    wheel = ("Wheel-Version: 1.0\nGenerator: worker_client_wheel.py\nRoot-Is-Purelib: true\n"
             "Tag: py3-none-any\n")
    files.append((f"{dist_info}/WHEEL", wheel.encode()))
    files.append((f"{dist_info}/top_level.txt", "".join(f"{p}\n" for p in PACKAGES).encode()))
    record = [_record_line(name, data) for name, data in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))

    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files:
            entry = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    (out / "requirements.txt").write_text("".join(f"{r}\n" for r in meta.requires))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=None,
                        help="the repository root (default: this file's, two levels up)")
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    args = parser.parse_args(argv)
    # Looked up only when not given: in the recipe's build stage this file is /src's own
    # (/src/worker_client_wheel.py), with no repository two levels above it.
    repo = args.repo if args.repo is not None else Path(__file__).resolve().parents[2]
    print(build(repo, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
