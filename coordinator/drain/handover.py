"""Main processes whose graceful signal the caller of the drain sends itself.

An exec ``preStop`` hook runs inside the engine container. When the drain ends that
container's main process, containerd's shim kills everything left in the container, the hook
included: it returns 137 and the kubelet records a ``FailedPreStopHook`` event after every
drain, graceful or not (docs/deploy.md). And the kubelet sends the container's main process
its SIGTERM only once the hook has returned.

So the hook can ask (``GET /drain?main=caller``) to be answered when the kill reaches the main
processes (the kill targets' roots), and leave their graceful signal to the kubelet's own
SIGTERM, which follows its return. The kill then waits for them as for any tier it signalled,
and SIGKILLs what outlives the tier's timeout; the summary says whose signal it was.

    1. a caller waits (``wait``) while the drain migrates and stops the other processes;
    2. when a tier holding roots is next, the kill asks ``take``: with a caller still waiting,
       every waiter is answered with those roots and the kill leaves their signal to the
       caller; with none, the kill signals them itself, as without a hook;
    3. a caller that arrives after the handover is answered at once; one that goes away
       before it (``forget``) takes nothing over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from coordinator.drain.outcome import GRACEFUL, Verdict, judge
from coordinator.kill.report import Fate, ProcessOutcome

LEFT_TO_CALLER = ("its graceful signal was left to the caller of the drain (GET "
                  "/drain?main=caller: the kubelet's SIGTERM once the preStop hook returned)")
"""The ``detail`` of a root handed over (replaced by the SIGKILL's reason if it outlived its
tier)."""


class Handover:
    """The waiting callers of one drain, and the roots handed to them."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[list[int]]] = []
        self.handed: list[int] | None = None
        """The roots left to the callers, once a handover happened in this drain."""

    def reset(self) -> None:
        """A new drain: nothing handed over yet (waiters of the last one are answered by its
        end, not by this one's roots)."""
        self.handed = None

    def wait(self) -> asyncio.Future[list[int]]:
        """Step 1 (and 3): a future resolved with the roots handed over."""
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        if self.handed is not None:
            future.set_result(list(self.handed))
        else:
            self._waiters.append(future)
        return future

    def forget(self, future: asyncio.Future[list[int]]) -> None:
        """Step 3: the caller went away (or was answered otherwise)."""
        if future in self._waiters:
            self._waiters.remove(future)
        future.cancel()

    def take(self, roots: list[int]) -> str | None:
        """Step 2: when a caller waits, it takes over the roots' graceful signal: the detail
        their outcomes carry; None when the kill is to signal them itself."""
        waiting = [f for f in self._waiters if not f.done()]
        self._waiters.clear()
        if not waiting:
            return None
        self.handed = list(roots)
        for future in waiting:
            future.set_result(list(roots))
        return LEFT_TO_CALLER

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in self._waiters)


def so_far(outcomes: Iterable[ProcessOutcome], force: bool = False) -> Verdict:
    """The judgement of the processes already settled when the caller is answered (the main
    processes, and what comes after them, still run): what the caller's exit code reports."""
    settled = [o for o in outcomes if o.fate is not Fate.RUNNING]
    if not settled:
        return Verdict(GRACEFUL, (), 0)
    return judge(settled, force=force)
