"""A scheduling hint for engines that share CPUs: a short slice for the engine's loop thread.

When every engine of a pod is woken by the same doorbell write and there are more engines than
CPUs, the order in which the kernel runs them decides when the last one sets its
``shutdown_event``. Each engine, once running, goes on from its notice to its hand-back work
(ending its streams, reporting) before it gives the CPU back, so the last engine waits for
the hand-back work of all the others (docs/benchmarks.md). Linux's EEVDF scheduler (6.12 and
later) lets a thread ask for a shorter slice: it is picked sooner after it wakes, and a
waking thread with a shorter slice may preempt a running one with a longer slice. With that
slice on each engine's loop thread, and one ``sched_yield`` right after the doorbell's
notice, the engines woken together take turns of about 0.1 ms, so their notices no longer
wait for each other's hand-back work (16 engines on 2 CPUs under load: the last notice
~14 → ~4 ms p99, docs/benchmarks.md).

Both only matter when CPUs are contended; they cost nothing otherwise. Unprivileged: a
thread may set its own slice without raising its priority. Older kernels accept the call and
ignore the slice. Not Linux, or an architecture whose system call number is not known here:
nothing is done.
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


def check_slice(slice_us: int) -> int:
    """``slice_us`` if the kernel can take it, else InvalidSetting (a ValueError)."""
    if not MIN_SLICE_US <= slice_us <= MAX_SLICE_US:
        raise InvalidSetting(
            f"latency_slice_us must be {MIN_SLICE_US}..{MAX_SLICE_US}, not {slice_us}")
    return slice_us


def set_thread_slice(slice_us: int) -> bool:
    """Ask for ``slice_us`` as the calling thread's scheduling slice; True when the kernel
    took the request."""
    check_slice(slice_us)
    number = _SCHED_SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return False
    policy = os.sched_getscheduler(0)
    if policy not in _FAIR_POLICIES:
        return False  # real-time or idle policies: not ours to change
    nice = os.getpriority(os.PRIO_PROCESS, 0)  # the calling thread's, on Linux
    attr = ctypes.create_string_buffer(
        _ATTR.pack(_ATTR.size, policy, 0, nice, 0, slice_us * 1000, 0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, attr, 0) != 0:
        log.info("scheduling slice not set: %s", os.strerror(ctypes.get_errno()))
        return False
    return True
