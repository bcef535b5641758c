"""A TCP relay on loopback, run as its own process so a test can stall it with SIGSTOP.

    python tcp_relay.py TARGET_PORT

Listens on a free loopback port, prints it on one line, then relays every connection to
``127.0.0.1:TARGET_PORT`` both ways until either side closes. Stopping the process holds
every byte in flight without closing anything: a stalled network path, for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def main(target_port: int) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    os.write(1, f"{port}\n".encode())
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
