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
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def end_with_parent() -> None:
    """SIGTERM when the test process that started this one dies (``PR_SET_PDEATHSIG``): a
    test run killed outright leaves no relay behind."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:
        sys.exit(0)


def main() -> int:
    end_with_parent()
    directory, pod_ip, *ports = sys.argv[1:]
    asyncio.run(serve(Path(directory), pod_ip, [int(p) for p in ports]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
