"""The node's way into a pod's network: a relay run inside the pod's network namespace.

The pods have no network but their own loopback (``netns = "none"``), plus the pod IP the
runner gives that loopback, so nothing on the host reaches them by TCP. The kubelet reaches a
pod at its IP (probes, an ``httpGet`` hook); the tests reach the engine and the coordinator
as a Service would. This relay, started with ``nsenter --net=<the pod's namespace>``, listens
on one Unix socket per port in a host directory (``DIR/<port>.sock``: a path, which any
network namespace can reach) and connects each client to ``POD_IP:<port>`` inside the pod,
as a connection from the node to the pod IP would arrive: a server bound to 127.0.0.1 only is
not reached, one bound to 0.0.0.0 or the pod IP is.

    nsenter --net=/proc/<infra pid>/ns/net python3 relay.py DIR POD_IP PORT [PORT ...]

It prints ``ready`` once every socket listens and exits 0 on SIGTERM. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(directory: Path, pod_ip: str, ports: list[int]) -> None:
    def relay_to(port: int):  # type: ignore[no-untyped-def]
        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(pod_ip, port)
            except OSError:
                writer.close()  # refused, as a connection to the pod IP would be
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        return relay

    servers = []
    for port in ports:
        path = directory / f"{port}.sock"
        path.unlink(missing_ok=True)
        servers.append(await asyncio.start_unix_server(relay_to(port), path=str(path)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    end_with_parent(loop, stop)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def end_with_parent(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Stop once the test process that started this one has exited (its pidfd turns
    readable): a test run killed outright leaves no relay behind. Not ``PR_SET_PDEATHSIG``:
    that fires when the thread that started the relay ends, and tests start pods from
    threads."""
    parent_pid = os.getppid()
    try:
        parent = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        stop.set()
        return
    loop.add_reader(parent, stop.set)
    if os.getppid() != parent_pid:  # it exited before its pidfd was open
        stop.set()


def main() -> int:
    directory, pod_ip, *ports = sys.argv[1:]
    asyncio.run(serve(Path(directory), pod_ip, [int(p) for p in ports]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
