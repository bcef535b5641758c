"""What the init comparison's containers need beyond ``tests.pods.podman.Podman`` (podman as
this machine runs it: root, runc, cgroupfs, storage under ``PODS_DIR``; its module says why).

The image is a Debian bookworm ``minbase`` made here with ``mmdebstrap`` and ``podman
import`` (no registry is reachable), remade only when its package list changes: the pod
tests' ``BASE`` (python3, Debian's ``tini``) for the simulated engine, their ``ENGINE_BASE``
(also what vLLM's CPU build needs at run time, and tini) for the real engines.

What the containers run comes from this host, mounted read-only at the same paths: the
repository and its virtualenv (the coordinator, the simulated engine, PyPI's ``dumb-init``),
the CPython that virtualenv was made from, and for a real engine its virtualenv and the
CPython it was made from. The records the processes write go to a directory mounted
read-write. The container shares the host's network (``--network host``), so the test reaches
the engine and the coordinator on loopback; its PID namespace is its own: its first process
is PID 1, which is what the comparison is about. Every container carries the label
``Podman.labels(INIT_LABEL)``: what a killed run left is removed by ``remove_leftovers``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.pods.podman import REPO, Podman, missing_tools
from tests.pods.podman import unavailable as podman_unavailable

INIT_LABEL = "init"
"""The label value (``tests.pods.podman.LABEL``) of the init comparison's containers."""


def remove(podman: Podman, name: str) -> None:
    """Remove the container, killing it if it still runs (the fallback that leaves nothing
    behind)."""
    podman.run("rm", "-f", "-t", "0", name, check=False)


def python_home() -> Path:
    """The CPython installation the virtualenv's interpreter links into."""
    return Path(os.path.realpath(sys.executable)).parents[1]


def mounts(records: Path, extra: Sequence[Path] = ()) -> list[str]:
    """``-v`` flags: the repository, the CPython, the records, and ``extra``, each at its own
    path (read-only but the records)."""
    flags = []
    for path in dict.fromkeys((REPO, python_home(), *extra)):
        flags += ["-v", f"{path}:{path}:ro"]
    return [*flags, "-v", f"{records}:{records}"]


def namespace_pids(pid1: int) -> list[int]:
    """The host PIDs of the processes in ``pid1``'s PID namespace (read from the host)."""
    try:
        ns = os.readlink(f"/proc/{pid1}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                found.append(int(entry))
        except OSError:
            continue
    return found


def namespace_states(pid1: int) -> dict[int, tuple[str, int]]:
    """The state letter (``Z``: a zombie) and the parent's host PID of each process in
    ``pid1``'s PID namespace."""
    states = {}
    for pid in namespace_pids(pid1):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        states[pid] = (state, int(parent))
    return states


def unavailable() -> str | None:
    """Why containers cannot run here, or None: podman as the pod tests run it
    (``tests.pods.podman.unavailable``), and mmdebstrap for the base."""
    missing = missing_tools(("mmdebstrap",))
    if missing:
        return "not installed: mmdebstrap (Debian: apt-get install mmdebstrap)"
    return podman_unavailable()
