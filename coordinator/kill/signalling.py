"""Signals to tracked processes: steps 5 and 6 of the kill (``ProcessTable``'s base class).

Every signal goes through the process's pidfd (by PID after a start-time check only without
pidfds). A tier's graceful signal is recorded once, with its time, whether the kill sends it
or leaves it to the caller; SIGKILL may be sent again (harmless) and keeps its first time.
A signal that cannot be sent is recorded on the process and never raised.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING

from coordinator.kill import pidfd, procfs
from coordinator.kill.report import ProcessOutcome

if TYPE_CHECKING:
    from coordinator.kill.table import Tracked

log = logging.getLogger(__name__)


class Signalling:
    """Signalling for ``ProcessTable`` (its base class): sends and records each signal."""

    def publish(self, outcome: ProcessOutcome) -> None:
        raise NotImplementedError  # ProcessTable's

    def send(self, t: Tracked, sig: int) -> bool:
        """Signal a tracked process through its pidfd; False when it already exited or the
        signal could not be sent (the reason is recorded on the process, never raised)."""
        if t.exited:
            return False
        try:
            if t.fd is not None:
                return pidfd.send_signal(t.fd, sig)
            # Polling fallback: the start-time check narrows, but cannot close, the reuse
            # race.
            stat = procfs.read_stat(t.outcome.pid)
            if stat is None or stat.zombie or stat.start_ticks != t.start_ticks:
                return False
            os.kill(t.outcome.pid, sig)
        except ProcessLookupError:
            return False
        except OSError as exc:
            name = signal.Signals(sig).name
            why = f"{name} could not be sent: {os.strerror(exc.errno or 0)}"
            log.error("pid %s: %s", t.outcome.pid, why)
            t.outcome.detail = f"{t.outcome.detail}; {why}" if t.outcome.detail else why
            return False
        return True

    def signal_graceful(self, t: Tracked, sig: int, tier: str,
                        kill_at: float | None = None) -> None:
        """Send the tier's graceful signal once and record it, with the time (epoch s) its
        SIGKILL is due if it still runs then."""
        if self._record_signal(t, sig, tier, kill_at):
            self.send(t, sig)
            self.publish(t.outcome)

    def reschedule_kill(self, t: Tracked, kill_at: float) -> None:
        """A process signalled by a previous run: its SIGKILL is now due at ``kill_at``."""
        if t.exited or t.outcome.killed_at is not None:
            return
        t.outcome.kill_at = kill_at
        self.publish(t.outcome)

    def leave_signal(self, t: Tracked, sig: int, tier: str, detail: str,
                     kill_at: float | None = None) -> None:
        """Record the tier's graceful signal as sent by someone else, now (its clock starts)."""
        if self._record_signal(t, sig, tier, kill_at):
            t.outcome.detail = detail
            self.publish(t.outcome)

    @staticmethod
    def _record_signal(t: Tracked, sig: int, tier: str, kill_at: float | None) -> bool:
        """Record the tier's graceful signal, now; False when one was recorded already."""
        if t.signalled:
            return False
        t.outcome.tier = tier
        t.outcome.signal = signal.Signals(sig).name
        t.outcome.signalled_at = time.time()
        t.outcome.kill_at = kill_at
        return True

    def sigkill(self, t: Tracked, tier: str, why: str) -> None:
        """SIGKILL a process that outlived its time (or force mode)."""
        if t.exited:
            return
        t.outcome.tier = t.outcome.tier or tier
        if t.outcome.killed_at is None:
            t.outcome.killed_at = time.time()
        t.outcome.detail = why
        self.send(t, signal.SIGKILL)
        self.publish(t.outcome)
