"""What a caller may change when no token vouches for it: ``kill(2)``'s rule, on every call
that changes something.

With a token configured, whoever holds it is trusted and nothing here applies. Without one,
the caller is the owner of its connection's socket (``peers``) and may act only on processes
it could signal itself: root (UID 0) on any, another UID only on processes whose real or
saved UID is its own. Call by call:

    POST /workers                       the process it registers (and the tree later found
                                        under it holds only processes that UID could signal)
    GET | POST | DELETE /drain          every process the drain would signal: the registered
                                        workers, their trees and the adopted trees, as a scan
                                        made for the call lists them
    DELETE /workers/{id}, POST /workers/{id}/report, GET /workers/{id}/events
                                        the worker's process
    POST /migrations/ack                the worker of every pending handoff it settles; an
                                        acknowledgement that comes before its handoff settles
                                        it only if the reporting worker is one it reaches
    POST /group/members, .../summary    trust alone (root, or a trusted network)

A caller whose socket is not in our network namespace (another host or pod) has no UID here:
it registers nothing, and does the rest only when the operator declared the network trusted
(``--allow-unauthenticated-network``: the coordinator listens on a non-loopback address
without a token). A caller whose socket could not be looked up is refused.

Refusals are ``RefusedCaller`` (a 403), naming the caller's UID and the processes it does not
reach.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.errors import RefusedCaller
from coordinator.kill import procfs
from coordinator.service import peers

if TYPE_CHECKING:
    from coordinator.service.posture import Posture
    from coordinator.service.registry import Worker
    from coordinator.service.runtime import Coordinator

ROOT_UID = 0
NAMED = 5
"""Processes a refusal names at most."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a request, as far as anything is enforced about it."""

    uid: int | None
    """Its socket's owner; None with the token, or for a caller from another namespace."""
    trusted: bool
    """The token, root, or a trusted network: nothing below is checked."""
    who: str
    """In words, for refusals and the log."""

    def reaches(self, uids: tuple[int, int] | None) -> bool:
        """Whether it could signal a process of these real and saved UIDs (None: a process
        whose owner is unknown, which only a trusted caller reaches)."""
        return self.trusted or (self.uid is not None and uids is not None
                                and self.uid in uids)


def identify(scope: Any, posture: Posture) -> Caller:
    """The caller of the request whose ASGI ``scope`` is given."""
    if posture.auth:
        return Caller(None, True, "a caller with the token")
    peer = peers.of_request(scope)
    if peer.uid == ROOT_UID:
        return Caller(ROOT_UID, True, "UID 0 (root)")
    if peer.uid is not None:
        return Caller(peer.uid, False, f"UID {peer.uid}")
    if peer.error is not None:
        return Caller(None, False, f"a caller whose socket could not be looked up "
                      f"({peer.error})")
    if posture.unauthenticated_network:
        return Caller(None, True, "a caller from the network, trusted by "
                      "--allow-unauthenticated-network")
    return Caller(None, False, "a caller from outside this host's network namespace")


def check_registration(caller: Caller, pid: int, posture: Posture) -> tuple[int, int] | None:
    """Raise ``RefusedCaller`` unless ``caller`` may register ``pid``; the process's real and
    saved UIDs (None when it is gone: the registration's own check says so)."""
    uids = procfs.uids(pid)
    if posture.auth:
        return uids
    if caller.uid is None:
        raise RefusedCaller(
            f"refusing to register pid {pid} for {caller.who}: without the token only a "
            "process of this host may register, each for processes of its own user")
    if uids is not None and not caller.reaches(uids):
        raise RefusedCaller(
            f"refusing to register pid {pid}: it belongs to UID {uids[0]} and the caller is "
            f"UID {caller.uid}: without the token a caller may only register processes it "
            "could signal itself (give the token, or register from the process's own user)")
    return uids


def check_worker(caller: Caller, worker: Worker, what: str) -> None:
    """Raise ``RefusedCaller`` unless ``caller`` could signal ``worker``'s process: as it is
    now while it runs, as it was registered once it has exited."""
    if caller.trusted:
        return
    uids = worker_uids(worker)
    if not caller.reaches(uids):
        owner = f"UID {uids[0]}" if uids is not None else "an unknown user"
        raise RefusedCaller(
            f"refusing to {what} worker {worker.id} (pid {worker.pid}, {owner}) for "
            f"{caller.who}: without the token a caller may only act on workers whose process "
            "it could signal itself")


def worker_uids(worker: Worker) -> tuple[int, int] | None:
    """The worker's process's real and saved UIDs: read now while it runs (a process may
    change them), else as recorded at registration."""
    if worker.alive:
        now = procfs.uids(worker.pid)
        if now is not None:
            return now
    return worker.uids


def drain_processes(coordinator: Coordinator) -> dict[int, str]:
    """PID → name of every process a drain would signal, as last listed: the registered
    workers, the trees listed under them and the adopted roots, and, once a kill runs, what
    it has not seen end."""
    found = {w.pid: w.name or w.role for w in coordinator.registry.alive()}
    found.update((o.pid, o.name) for o in coordinator.scan.scanned.values())
    found.update((f.pid, f.name) for f in coordinator.scan.adopted)
    drain = coordinator.controller.drain
    if drain is not None and coordinator.machine.phase.killing_or_done:
        found.update((o.pid, o.name) for o in drain.outcomes.values() if not o.fate.final)
    return found


def check_drain(caller: Caller, processes: dict[int, str], what: str) -> None:
    """Raise ``RefusedCaller`` unless ``caller`` could signal every one of ``processes``
    (PID → name) that still runs."""
    if caller.trusted:
        return
    beyond = [(pid, name, uids) for pid, name in sorted(processes.items())
              if (uids := procfs.uids(pid)) is not None and not caller.reaches(uids)]
    if beyond or caller.uid is None:
        named = ", ".join(f"pid {pid} ({name}, UID {uids[0]})" for pid, name, uids in
                          beyond[:NAMED])
        more = f" and {len(beyond) - NAMED} more" if len(beyond) > NAMED else ""
        reason = (f"the drain would signal {named}{more}, which it could not signal itself"
                  if beyond else "its processes cannot be told")
        raise RefusedCaller(f"refusing to {what} for {caller.who}: {reason} (without the "
                            "token a caller may only drain processes it could signal)")


def check_acks(caller: Caller, workers: Iterable[Worker]) -> None:
    """Raise ``RefusedCaller`` unless ``caller`` reaches every worker whose pending handoff
    it acknowledges (nothing is applied then)."""
    if caller.trusted:
        return
    for worker in workers:
        check_worker(caller, worker, "acknowledge a handoff of")


def check_trusted(caller: Caller, what: str) -> None:
    """Raise ``RefusedCaller`` unless ``caller`` is trusted (for calls that name no
    process)."""
    if not caller.trusted:
        raise RefusedCaller(f"refusing to {what} for {caller.who}: without the token only "
                            "root (or a caller from a trusted network) may")


def rules(posture: Posture) -> dict[str, str]:
    """What is enforced on each call that changes something, in words (``/status``
    ``security.enforced``)."""
    if posture.auth:
        everyone = "callers with the token (any process)"
        return {"register": everyone, "drain": everyone, "worker": everyone,
                "ack": everyone, "group": everyone, "trees": "every process found under a "
                "registered worker (descendants, session, unit)"}
    network = ("callers from other hosts (no UID here) as trusted, by "
               "--allow-unauthenticated-network" if posture.unauthenticated_network
               else "callers from other hosts refused")
    return {
        "caller": "the owner of the client's socket, one exact kernel lookup (sock_diag); "
                  f"root trusted; {network}",
        "register": "local callers, each only a process it could signal (real or saved UID "
                    "its own; root: any)",
        "drain": "start, join, force or abort: only a caller that could signal every process "
                 "the drain would signal (checked against a scan made for the call)",
        "worker": "deregister, report, event streams: only a caller that could signal the "
                  "worker's process",
        "ack": "only a caller that could signal the handed-back request's worker; an early "
               "acknowledgement settles a handoff only of a worker its caller reaches",
        "group": "root or a trusted network only",
        "trees": "a worker registered by a non-root caller: only processes that caller could "
                 "signal are found under it (descendants, session, unit)",
    }
