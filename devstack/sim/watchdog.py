"""The main process's child watchdog: reaps children and, while armed, kills the tree.

SGLang's ``SubprocessWatchdog`` watches the engine's children and, when one of them dies,
SIGKILLs the whole process tree — so a drain that stops the children first turns into a
crash unless the watchdog is stood down beforehand. This thread does the same: it waits on
the children's pidfds (an event per exit, no polling), collects each exit status, and calls
``on_fire`` for the first exit while armed, then ``on_exit`` for every exit.
``stand_down()`` disarms it for good; the thread keeps reaping so no child lingers as a
zombie.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterable

from devstack.sim.linux import open_pidfd
from devstack.sim.spawn import StartedChild

ExitCallback = Callable[[StartedChild, "int | None"], None]


class ChildWatchdog:
    """Watches the main process's direct children from a daemon thread."""

    def __init__(
        self,
        children: list[StartedChild],
        *,
        armed: bool,
        on_fire: ExitCallback,
        on_exit: ExitCallback | None = None,
    ) -> None:
        self.children = list(children)
        self.exit_codes: dict[int, int | None] = {}
        """PID → subprocess-style exit code, for every child that has exited."""
        self._armed = armed
        self._stood_down = threading.Event()
        self._on_fire = on_fire
        self._on_exit = on_exit
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="child-watchdog", daemon=True)

    @property
    def state(self) -> str:
        """``armed``, ``stood_down`` or ``off``."""
        if not self._armed:
            return "off"
        return "stood_down" if self._stood_down.is_set() else "armed"

    def start(self) -> None:
        self._thread.start()

    def stand_down(self) -> None:
        """Never kill the tree from now on (the drain is about to stop the children)."""
        self._stood_down.set()

    def wait_exited(self, pids: Iterable[int], timeout_s: float) -> set[int]:
        """Block until these children have exited (and are reaped); return those still alive."""
        wanted = set(pids)
        with self._changed:
            self._changed.wait_for(lambda: wanted <= self.exit_codes.keys(), timeout_s)
            return wanted - self.exit_codes.keys()

    def _run(self) -> None:
        poller = select.poll()
        by_fd: dict[int, StartedChild] = {}
        for child in self.children:
            fd = open_pidfd(child.pid)
            if fd is None:
                self._reaped(child)
                continue
            by_fd[fd] = child
            poller.register(fd, select.POLLIN)
        while by_fd:
            for fd, _ in poller.poll():
                if fd not in by_fd:
                    continue
                child = by_fd.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                self._reaped(child)

    def _reaped(self, child: StartedChild) -> None:
        code = child.popen.wait()
        with self._changed:
            self.exit_codes[child.pid] = code
            self._changed.notify_all()
        if self._armed and not self._stood_down.is_set():
            self._on_fire(child, code)
        # After the decision to fire, so whoever sees this knows the watchdog let it pass.
        if self._on_exit is not None:
            self._on_exit(child, code)
