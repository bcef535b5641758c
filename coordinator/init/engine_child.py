"""The engine's main process: started as this process's child, signalled through a pidfd.

``start`` runs the command with ``posix_spawnp`` (a ``PATH`` search, as a shell would):

- in a session of its own (``setsid``): a process group, and so a ``kill -TERM -PGID``
  aimed at the job that started this process, or a terminal's Ctrl-C, reaches this process
  alone, which turns it into the drain or passes it on; and the engine's orphans stay
  findable by their session (the kill engine's discovery) after their parent died;
- with standard input, output and error as they are here, untouched (no pipe in between:
  the engine writes to the container's log itself); every other descriptor of this process
  is close-on-exec, the listening socket included;
- with an empty signal mask, and the signals this process ignores or handles back at their
  default action (Python ignores ``SIGPIPE`` and ``SIGXFSZ``; an exec keeps what is
  ignored);
- with ``SHUTDOWN_COORDINATOR_URL`` (and the token file, when one is set) in its
  environment, unless already there, so a ``worker_client`` inside finds this coordinator;
  and with its ``--engine`` profile's ``engine_env`` where the environment leaves it unset
  (vLLM: how long EngineCore waits for its Workers to exit before it SIGTERMs them).

No ``subprocess.Popen``: it would wait for the child itself (``poll``, its finalizer, the
next ``Popen``'s cleanup) and take its status from the reaper. The pidfd is opened at once:
it names this child for as long as it is open, so a forwarded signal can never reach a later
process that was given the same PID.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.kill import procfs

EXIT_NOT_EXECUTABLE = 126
"""The command exists but could not be run (a shell's code, and tini's)."""
EXIT_NOT_FOUND = 127
"""The command was not found (a shell's code)."""

RESET_TO_DEFAULT = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM,
                    signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                    signal.SIGCHLD, signal.SIGALRM, signal.SIGWINCH)
"""Signals the engine starts with at their default action, whatever this process does
with them."""


class SpawnError(Exception):
    """The command could not be started; ``exit_code`` is what a shell would exit with."""

    def __init__(self, argv: Sequence[str], exc: OSError) -> None:
        super().__init__(f"cannot run {argv[0]!r}: {exc.strerror or exc}")
        self.exit_code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) \
            else EXIT_NOT_EXECUTABLE


@dataclass
class EngineChild:
    """The engine's main process, as started."""

    pid: int
    start_ticks: int | None
    pidfd: int | None
    argv: tuple[str, ...]

    def send(self, sig: int) -> bool:
        """Signal the main process (never its group); False when it has exited."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def child_environment(environ: Mapping[str, str], url: str, token_file: str | None,
                      defaults: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """The engine's environment: ours, plus where this coordinator listens, plus
    ``defaults`` (its profile's ``engine_env``) where ours leaves them unset."""
    env = dict(environ)
    env.setdefault("SHUTDOWN_COORDINATOR_URL", url)
    if token_file is not None:
        env.setdefault("SHUTDOWN_COORDINATOR_TOKEN_FILE", token_file)
    for name, value in defaults:
        env.setdefault(name, value)
    return env


def start(argv: Sequence[str], env: Mapping[str, str]) -> EngineChild:
    """Start ``argv`` as described in the module docstring; ``SpawnError`` when it cannot."""
    try:
        pid = os.posix_spawnp(argv[0], list(argv), dict(env), setsid=True, setsigmask=(),
                              setsigdef=RESET_TO_DEFAULT)
    except OSError as exc:
        raise SpawnError(argv, exc) from exc
    try:
        fd: int | None = os.pidfd_open(pid)
    except OSError:
        fd = None  # the child is still signalled by PID: it cannot be reaped behind our back
    stat = procfs.read_stat(pid)
    return EngineChild(pid=pid, start_ticks=stat.start_ticks if stat else None, pidfd=fd,
                       argv=tuple(argv))
