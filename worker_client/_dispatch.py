"""What the coordinator's events and its doorbell do to this process.

- ``hello`` (every stream opened): watch the doorbell it names; join a drain under way, or
  end a drain the coordinator no longer runs (but not one started here by a signal);
- the doorbell rings (on the loop): start the drain (the line with its deadlines follows);
- ``drain``: start the drain, or add its deadlines to what the doorbell started;
- ``abort``: end the drain, and watch the doorbell again;
- ``terminate``: run the pre-kill hooks, then report ``prekill_done``;
- a registration answered in a drain phase: join that drain.
"""

from __future__ import annotations

from typing import Any

import shutdown_wire as wire
from worker_client._doorbell import DoorbellWatch
from worker_client._drain import DrainState
from worker_client._loop import LoopBridge
from worker_client._prekill import PrekillHooks
from worker_client._scheduling import LoopScheduling


class EventDispatch:
    def __init__(self, bridge: LoopBridge, drain: DrainState, prekill: PrekillHooks,
                 scheduling: LoopScheduling) -> None:
        self._bridge = bridge
        self._drain = drain
        self._prekill = prekill
        self._scheduling = scheduling
        self._doorbell: DoorbellWatch | None = None
        """The coordinator's doorbell, watched on the loop (loop reader only)."""
        drain.on_abort_on_loop = self._rearm_doorbell

    def registered(self, answer: dict[str, Any]) -> None:
        if answer.get("phase") in wire.DRAIN_PHASES:
            self._drain.begin({"type": wire.EVENT_DRAIN, "reason": "joined a running drain"},
                              "register")

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == wire.EVENT_DRAIN:
            self._drain.begin(event, "push")
        elif kind == wire.EVENT_HELLO:
            phase = event.get("phase")
            self._watch_doorbell(event.get("doorbell"))
            if phase in wire.DRAIN_PHASES:
                self._drain.begin({**event, "type": wire.EVENT_DRAIN}, "hello")
            elif (phase == wire.PHASE_SERVING and self._drain.event
                  and self._drain.event.get("source") != "local"):
                self._drain.abort()
        elif kind == wire.EVENT_ABORT:
            self._drain.abort()
        elif kind == wire.EVENT_TERMINATE:
            self._prekill.start()

    def close_doorbell(self) -> None:
        if self._doorbell is not None:
            self._bridge.call_if_running(self._doorbell.close)

    def _watch_doorbell(self, info: Any) -> None:
        """On the loop (loop reader): watch the pipe the ``hello`` named. A ring heard while
        already draining is a no-op, so this does not depend on the phase."""
        if not self._bridge.here():
            return  # the thread reader: the stream alone
        assert self._bridge.loop is not None
        if self._doorbell is None:
            self._doorbell = DoorbellWatch(self._bridge.loop, self._rang)
        self._doorbell.arm(info)

    def _rang(self) -> None:
        self._drain.begin({"type": wire.EVENT_DRAIN, "reason": "doorbell"}, "doorbell")
        # Every engine of the pod woke at this same write: let those not yet run set their
        # events before this one starts handing its requests back (``_scheduling``).
        self._scheduling.rang()

    def _rearm_doorbell(self) -> None:
        self._scheduling.aborted()
        if self._doorbell is not None:
            self._doorbell.rearm()
