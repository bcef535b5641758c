"""One container at a time under podman, as this machine runs it, for the init comparison.

podman as root with runc (``crun`` refuses this host's cgroup layout), cgroupfs, the file
events logger, and the ulimits a machine without ``CAP_SYS_RESOURCE`` can give, selected by
``CONTAINERS_CONF``; storage under ``PODS_DIR`` (default ``<repo>/.pods``) given as
``--root``/``--runroot`` flags. The image is the pod tests' base (``tests.pods.images.BASE``):
a Debian bookworm ``minbase`` with python3 and Debian's ``tini``, made here with
``mmdebstrap`` and ``podman import`` (no registry is reachable), remade only when its package
list changes.

What the containers run comes from this host, mounted read-only at the same paths: the
repository and its virtualenv (the coordinator, the simulated engine, PyPI's ``dumb-init``)
and the CPython that virtualenv was made from. The records the processes write go to a
directory mounted read-write. The container shares the host's network (``--network host``),
so the test reaches the engine and the coordinator on loopback; its PID namespace is its
own: its first process is PID 1, which is what the comparison is about.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.pods.images import Images
from tests.pods.podman import CONTAINERS_CONF, LABEL, PODS_DIR, REPO, missing_tools
from tests.pods.podman import Podman as PodPodman
from tests.pods.podman import unavailable as podman_unavailable

COMMAND_S = 300.0


class PodmanError(RuntimeError):
    """A podman command failed (its command line and stderr in the message)."""


@dataclass
class Podman:
    home: Path = PODS_DIR

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / "containers.conf"
        if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
            conf.write_text(CONTAINERS_CONF)

    def run(self, *args: str, check: bool = True,
            timeout: float = COMMAND_S) -> subprocess.CompletedProcess[str]:
        argv = ["podman", "--root", str(self.home / "storage"), "--runroot",
                str(self.home / "run"), *args]
        done = subprocess.run(argv, env={**os.environ,
                                         "CONTAINERS_CONF": str(self.home / "containers.conf")},
                              capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)}: exit {done.returncode}\n"
                              f"{done.stderr.strip()}")
        return done

    def inspect(self, name: str) -> dict[str, Any]:
        found = json.loads(self.run("container", "inspect", name).stdout)
        data: dict[str, Any] = found[0]
        return data

    def image(self) -> str:
        """The base image (Debian minbase, python3, tini): the pod tests' ``BASE``, made by
        them when missing or when its package list changed."""
        return Images(PodPodman(self.home)).base()

    def remove(self, name: str) -> None:
        """Remove the container, killing it if it still runs (the fallback that leaves
        nothing behind)."""
        self.run("rm", "-f", "-t", "0", name, check=False)

    def remove_leftovers(self) -> None:
        found = self.run("ps", "-aq", "--filter", f"label={LABEL}=init", check=False)
        if found.stdout.split():
            self.run("rm", "-f", "-t", "0", *found.stdout.split(), check=False)


def python_home() -> Path:
    """The CPython installation the virtualenv's interpreter links into."""
    return Path(os.path.realpath(sys.executable)).parents[1]


def mounts(records: Path, extra: Sequence[Path] = ()) -> list[str]:
    """``-v`` flags: the repository, the CPython, the records, and ``extra``, each at its own
    path (read-only but the records)."""
    flags = []
    for path in (REPO, python_home(), *extra):
        flags += ["-v", f"{path}:{path}:ro"]
    return [*flags, "-v", f"{records}:{records}"]


def unavailable() -> str | None:
    """Why containers cannot run here, or None: podman as the pod tests run it
    (``tests.pods.podman.unavailable``), and mmdebstrap for the base."""
    missing = missing_tools(("mmdebstrap",))
    if missing:
        return "not installed: mmdebstrap (Debian: apt-get install mmdebstrap)"
    return podman_unavailable()
