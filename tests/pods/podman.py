"""podman, as the pod tests run it on this kind of machine: root, runc, cgroupfs, no network.

Everything podman keeps lives under ``PODS_DIR`` (default ``<repo>/.pods``): its image and
container storage (given as ``--root``/``--runroot`` flags; a ``CONTAINERS_STORAGE_CONF``
made every ``podman run`` hang for 20 s at exit here), and the ``containers.conf`` that
``CONTAINERS_CONF`` selects:

- ``runtime = "runc"``: ``crun`` refuses this host's hybrid cgroup layout;
- ``cgroup_manager = "cgroupfs"``, ``events_logger = "file"``: there is no systemd;
- ``netns = "none"``: no CNI here; a pod still gets a network namespace of its own with its
  loopback, which its containers share (the tests reach it with ``relay``);
- ``default_ulimits``: the machine lacks ``CAP_SYS_RESOURCE`` and podman lowers its own
  ``RLIMIT_NPROC`` hard limit to 32768 at start, so a container cannot be given more.

Every object the tests make carries the label ``LABEL``, so what a crashed run left behind is
found and removed (``remove_leftovers``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PODS_DIR = Path(os.environ.get("PODS_DIR") or REPO / ".pods").resolve()
LABEL = "io.shutdown-coordinator.test"
"""Label on every pod and container the tests create (its value: the pod's name)."""
OWNER = "io.shutdown-coordinator.test.owner"
"""Label naming the test process that created it (``owner()``): leftovers are removed only
when that process is gone, so test runs beside each other leave each other's pods alone."""
CONTAINERS_CONF = """\
# Written by tests/pods/podman.py: podman as the pod tests run it on this machine.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "none"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
COMMAND_TIMEOUT_S = 300.0
"""Bounds one podman command that hangs (a build has its own bound)."""


class PodmanError(RuntimeError):
    """A podman command failed; the message has its command line and its stderr."""


class Podman:
    """The podman command line with this machine's settings (see the module's docstring)."""

    def __init__(self, home: Path = PODS_DIR) -> None:
        self.home = home
        self.conf = home / "containers.conf"
        self.root = home / "storage"
        self.runroot = home / "run"

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.conf.exists() or self.conf.read_text() != CONTAINERS_CONF:
            self.conf.write_text(CONTAINERS_CONF)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def argv(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.root), "--runroot", str(self.runroot), *args]

    def run(self, *args: str, check: bool = True, timeout: float = COMMAND_TIMEOUT_S,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run one podman command; ``PodmanError`` when it fails and ``check``."""
        done = subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, input=stdin,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)}: exit {done.returncode}\n"
                              f"{done.stderr.strip()}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args).stdout or "null")

    def inspect(self, name: str) -> dict[str, Any]:
        """``podman inspect`` of one container."""
        found = self.json("container", "inspect", name)
        assert isinstance(found, list), found
        assert len(found) == 1, found
        data: dict[str, Any] = found[0]
        return data

    def image_exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def image_labels(self, image: str) -> dict[str, str]:
        found = self.json("image", "inspect", image)
        labels: dict[str, str] = (found[0].get("Labels") or {}) if found else {}
        return labels

    def labels(self, value: str) -> list[str]:
        """The ``--label`` options of an object made for pod ``value`` by this process."""
        return ["--label", f"{LABEL}={value}", "--label", f"{OWNER}={owner()}"]

    def remove_leftovers(self, value: str | None = None) -> None:
        """Remove what the tests made, killing what still runs: the pod ``value``'s pods and
        containers; or (``value`` None) every labelled one whose owner is this process or
        a process that is gone (a run killed before it cleaned up). The fallback that leaves
        nothing behind."""
        selector = f"label={LABEL}" if value is None else f"label={LABEL}={value}"
        for listing, removal in ((("pod", "ps"), ("pod", "rm")), (("ps", "-a"), ("rm",))):
            found = self.run(*listing, "--filter", selector, "--format", "{{.ID}} {{.Labels}}",
                             check=False).stdout.splitlines()
            doomed = [line.split(" ", 1)[0] for line in found if line.strip()
                      and (value is not None or _removable(line))]
            if doomed:
                self.run(*removal, "-f", "-t", "0", *doomed, check=False)


def _removable(line: str) -> bool:
    """A listed object whose owner label names this process or one that is gone."""
    found = re.search(re.escape(OWNER) + r":(\d+):(\d+)", line)
    if found is None:
        return True
    return found.group(0).split(":", 1)[1] == owner() or not owner_alive(found.group(1),
                                                                           found.group(2))


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def owner_alive(pid: str, ticks: str) -> bool:
    """The process ``owner()`` named by these is still running."""
    return _start_ticks(int(pid)) == ticks


@functools.cache
def owner() -> str:
    """This test process: its PID and start time (a reused PID is another process)."""
    return f"{os.getpid()}:{_start_ticks(os.getpid())}"


def missing_tools(tools: Sequence[str] = ("podman", "runc", "catatonit")) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None
            and not Path("/usr/libexec/podman", tool).exists()]


@functools.cache
def unavailable() -> str | None:
    """Why podman cannot run pods here, or None when it can (asked once per process)."""
    missing = missing_tools()
    if missing:
        return (f"not installed: {', '.join(missing)} (Debian: apt-get install podman runc "
                "catatonit; scripts/test.sh installs them)")
    if os.geteuid() != 0:
        return "the pod tests run podman as root (rootless podman is not set up here)"
    podman = Podman()
    podman.prepare()
    try:
        done = podman.run("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False,
                          timeout=120)
    except subprocess.TimeoutExpired:
        return "podman info timed out"
    if done.returncode != 0:
        return f"podman cannot run here: {done.stderr.strip()[-400:]}"
    if done.stdout.strip() != "runc":
        return f"podman's runtime is {done.stdout.strip()!r}, not runc"
    return None
