"""Which group a coordinator belongs to, and its place in it.

From the LeaderWorkerSet environment every pod of a group gets (``LWS_LEADER_ADDRESS``,
``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``; index 0 is the leader), or from the settings for
hosts without it (``--group-leader URL``, ``--group-size N``, ``--group-index I``); a
setting given wins over the environment. The leader's coordinator is reached at
``http://$LWS_LEADER_ADDRESS:<this coordinator's port>`` (every pod of a LeaderWorkerSet runs
the same template, so the same port). No group (nothing set, or a size of 1): the
coordinator drains its pod alone, as without this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
LEADER_INDEX = 0
MAX_GROUP_SIZE = 1024
"""Pods in one group at most (LeaderWorkerSet groups are a handful to a few dozen)."""


class GroupSettingError(ValueError):
    """The group settings (or environment) contradict each other; the message says how."""


class GroupSettings(Protocol):
    """The settings membership is read from (``coordinator.settings.Settings``)."""

    group_leader: str | None
    group_size: int | None
    group_index: int | None
    group_url: str | None
    port: int


@dataclass(frozen=True)
class Membership:
    """This coordinator's place in its group."""

    index: int
    size: int
    leader_url: str
    """The leader's coordinator (this one's own URL, or empty, on the leader)."""
    own_url: str | None = None
    """How peers reach this coordinator, when known (announced to the leader)."""

    @property
    def is_leader(self) -> bool:
        return self.index == LEADER_INDEX

    @property
    def followers(self) -> range:
        return range(LEADER_INDEX + 1, self.size)

    def to_status(self) -> dict[str, object]:
        return {"index": self.index, "size": self.size,
                "role": "leader" if self.is_leader else "follower",
                "leader_url": self.leader_url or None, "url": self.own_url}


def membership(settings: GroupSettings, environ: Mapping[str, str]) -> Membership | None:
    """This coordinator's group, or None when it is in none (``GroupSettingError`` when
    what is given cannot make one)."""
    size = settings.group_size if settings.group_size is not None else _env_int(
        environ, LWS_GROUP_SIZE)
    index = settings.group_index if settings.group_index is not None else _env_int(
        environ, LWS_WORKER_INDEX)
    leader = settings.group_leader
    if leader is None and environ.get(LWS_LEADER_ADDRESS):
        leader = f"http://{_host(environ[LWS_LEADER_ADDRESS])}:{settings.port}"
    if size is None and index is None and leader is None:
        return None
    if size is None or index is None:
        raise GroupSettingError(
            "a group needs its size and this pod's index (--group-size and --group-index, "
            f"or {LWS_GROUP_SIZE} and {LWS_WORKER_INDEX})")
    if not 1 <= size <= MAX_GROUP_SIZE:
        raise GroupSettingError(f"group size {size} is outside [1, {MAX_GROUP_SIZE}]")
    if not 0 <= index < size:
        raise GroupSettingError(f"group index {index} is outside [0, {size - 1}]")
    if size == 1:
        return None  # a group of one is a pod: nothing to coordinate
    if index != LEADER_INDEX and not leader:
        raise GroupSettingError(
            f"a follower (index {index}) needs its leader's coordinator (--group-leader URL, "
            f"or {LWS_LEADER_ADDRESS})")
    if leader and settings.port == 0 and settings.group_leader is None:
        raise GroupSettingError(f"{LWS_LEADER_ADDRESS} needs a fixed --port: the leader's "
                                "coordinator is found on this coordinator's port")
    return Membership(index=index, size=size,
                      leader_url=(leader or "").rstrip("/") if index else "",
                      own_url=settings.group_url)


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise GroupSettingError(f"{name}={text!r} is not an integer") from exc


def _host(address: str) -> str:
    """An address as a URL's host (an IPv6 address in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
