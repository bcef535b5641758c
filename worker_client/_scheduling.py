"""How an engine's loop thread is scheduled around a drain notice, for engines that share CPUs.

When every engine of a pod is woken by the same doorbell write and there are more engines than
CPUs, the order in which the kernel runs them decides when the last one sets its
``shutdown_event``. Each engine, once running, goes on from its notice to its hand-back work
(ending its streams, reporting) before it gives the CPU back, so the last engine waits for
the hand-back work of all the others (docs/benchmarks.md). Linux's EEVDF scheduler (6.12 and
later) lets a thread ask for a shorter slice: its turns end sooner, and a waking thread with a
shorter slice may preempt a running one with a longer slice. With a short slice on each
engine's loop thread, and one ``sched_yield`` right after the doorbell's notice, the engines
woken together take turns of about 0.1 ms, so their notices no longer wait for each other's
hand-back work.

Three modes (``WorkerClient(latency_slice_us=...)``):

- ``None``, the default: from the doorbell's ring on, the loop thread takes a 100 us slice
  (``DRAIN_SLICE_US``) and yields once; an aborted drain gives it back the kernel's default.
  Nothing changes while the engine serves.
- ``N`` (100..100,000): the loop thread keeps an N us slice from the client's start, and
  yields after the ring (a short slice also when woken, at the cost of shorter turns while
  serving too).
- ``0``: the engine's scheduling is left alone.

Only matters when CPUs are contended; costs nothing otherwise (two system calls per drain).
Unprivileged: a thread may set its own slice without raising its priority. Older kernels
accept the call and ignore the slice. Not Linux, or an architecture whose system call number
is not known here: nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import struct
import sys

from worker_client.errors import InvalidSetting

log = logging.getLogger("worker_client")

MIN_SLICE_US = 100
"""The kernel's lower bound for a fair task's slice."""
MAX_SLICE_US = 100_000

_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274, "arm64": 274, "riscv64": 274,
                  "ppc64le": 355, "s390x": 345}
"""sched_setattr(2) by machine (the generic table's 274 on the newer architectures)."""
_ATTR = struct.Struct("IIQiIQQQ")
"""struct sched_attr, first version (48 bytes): size, policy, flags, nice, priority,
runtime (the slice for fair policies), deadline, period."""
_FAIR_POLICIES = {getattr(os, "SCHED_OTHER", 0), getattr(os, "SCHED_BATCH", 3)}


DRAIN_SLICE_US = 100
"""The slice the loop thread takes at the doorbell's ring, by default."""
OFF = 0
"""``latency_slice_us=0``: the engine's scheduling is left alone."""


def check_slice(slice_us: int) -> int:
    """``slice_us`` if the kernel can take it (or ``OFF``), else InvalidSetting (a
    ValueError)."""
    if slice_us != OFF and not MIN_SLICE_US <= slice_us <= MAX_SLICE_US:
        raise InvalidSetting(
            f"latency_slice_us must be {OFF} (off) or {MIN_SLICE_US}..{MAX_SLICE_US}, "
            f"not {slice_us}")
    return slice_us


def set_thread_slice(slice_us: int) -> bool:
    """Ask for ``slice_us`` as the calling thread's scheduling slice; True when the kernel
    took the request."""
    if slice_us == OFF:
        raise InvalidSetting("set_thread_slice needs a slice; reset_thread_slice() clears it")
    check_slice(slice_us)
    return _set_runtime_ns(slice_us * 1000)


def reset_thread_slice() -> bool:
    """Give the calling thread the kernel's default slice again; True when it took it."""
    return _set_runtime_ns(0)


def _set_runtime_ns(runtime_ns: int) -> bool:
    number = _SCHED_SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return False
    policy = os.sched_getscheduler(0)
    if policy not in _FAIR_POLICIES:
        return False  # real-time or idle policies: not ours to change
    nice = os.getpriority(os.PRIO_PROCESS, 0)  # the calling thread's, on Linux
    attr = ctypes.create_string_buffer(
        _ATTR.pack(_ATTR.size, policy, 0, nice, 0, runtime_ns, 0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, attr, 0) != 0:
        log.info("scheduling slice not set: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


class LoopScheduling:
    """The engine's loop thread around a drain notice, in one of the three modes above.
    Every method runs on the loop's thread (the slice is per thread)."""

    def __init__(self, slice_us: int | None) -> None:
        self.slice_us = slice_us
        self.slice_set: bool | None = None
        """Whether the kernel took the slice (None until asked)."""
        self._for_drain = False

    @property
    def yields_after_ring(self) -> bool:
        return self.slice_us != OFF

    def bound(self) -> None:
        """The client is bound to the loop: a slice kept for good is taken now."""
        if self.slice_us is not None and self.slice_us != OFF and self.slice_set is None:
            self.slice_set = set_thread_slice(self.slice_us)

    def rang(self) -> None:
        """The doorbell's notice was acted on: short turns from now on, and one given up
        at once so that the engines woken by the same write get theirs."""
        if self.slice_us == OFF:
            return
        if self.slice_us is None and not self._for_drain:
            self._for_drain = True
            self.slice_set = set_thread_slice(DRAIN_SLICE_US)
        os.sched_yield()

    def aborted(self) -> None:
        """The drain was aborted: the slice taken for it is given back."""
        if self._for_drain:
            self._for_drain = False
            reset_thread_slice()
            self.slice_set = None
