"""SGLang's own server, with its in-flight streams handed back when the pod drains and every
process of its tree ending cleanly.

Run it as ``python -m sglang.launch_server`` is run, with SGLang's own flags and two more::

    python deploy/examples/sglang/drainable_server.py --model-path DIR --port 30000 \\
        --coordinator http://127.0.0.1:8787 [--coordinator-token-file F]

It is SGLang's HTTP server (``sglang.srt.entrypoints.http_server.launch_server``: every
OpenAI route, ``/metrics``, what smg asks of a worker), given through the seams that function
offers, and one ASGI middleware:

1. the process registers with the pod's shutdown-coordinator (``--coordinator`` or
   ``SHUTDOWN_COORDINATOR_URL``) and declares its main process as the first tier
   (``include_root``): the main process stops its own children, in order, on its SIGTERM;
2. each ``POST /v1/completions``, ``/v1/chat/completions`` and ``/generate`` runs inside
   ``client.track(rid)`` (the middleware gives the request SGLang's ``rid``): when a drain
   starts, the request is aborted in the engine (``TokenizerManager.abort_request``: the
   scheduler frees its KV cache) and the stream ends with a ``handed_back`` event instead of
   ``[DONE]`` (a stream handed back before its first byte is only that event; a request
   that does not stream gets a 503 with it), so the router or the
   continuation proxy continues it on another worker. The event's ``tokens`` are the
   engine's own count (``meta_info.completion_tokens``) of what the relayed chunks carried:
   a chunk may carry several tokens, and a chat chunk carries no ids to count;
3. SGLang's own SIGTERM path is not used: it SIGKILLs the detokenizer and the multiprocessing
   resource tracker at every shutdown (``sigterm_watchdog`` → ``kill_process_tree`` in
   ``managers/tokenizer_manager.py``). The tokenizer manager's ``signal_handler_class`` is
   replaced by one whose SIGTERM does nothing of its own (its SIGQUIT, a crashed child, is
   SGLang's); ``install_graceful_shutdown`` puts the drain in front of uvicorn's SIGTERM, and
   when uvicorn stops, the lifespan's end stops the engine in order (``stop_engine``): the
   child watchdog stood down, ``ShutdownReq`` (the schedulers leave their loop, release
   their resources and exit 0), then SIGTERM to the detokenizer (and the data-parallel
   controller), which this module gives a handler that leaves its endless loop and exits 0
   (``run_detokenizer_until_sigterm``, passed to ``launch_server`` as
   ``run_detokenizer_process_func``; ``run_dp_controller_until_sigterm`` likewise, whose
   scheduler-holding threads end with it; their receive waits 100 ms at a time, so a
   SIGTERM also ends a wait; each says on stderr that its exit cleanup ran, or that it was
   forced). The main process then exits 0, and the resource tracker, whose pipe it held,
   exits 0 after it;
4. a pre-kill hook stands the child watchdog down before the coordinator's kill begins.

What it does not change: SGLang's files, its scheduler, its SIGQUIT crash path.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psutil

from worker_client import Tier, WorkerClient, handed_back_event, install_graceful_shutdown

log = logging.getLogger("drainable_sglang")

TRACKED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/generate"})
SCHEDULER_EXIT_S = 15.0
"""How long the schedulers get to leave after ``ShutdownReq`` (SGLang's own bound)."""
CHILD_EXIT_S = 10.0
"""How long the detokenizer and the DP controller get after their SIGTERM."""
MAIN_TIER_S = 60.0
"""The main process's tier: the engine's orderly stop, well inside it."""

OWN_FLAGS = {"--coordinator": "SHUTDOWN_COORDINATOR_URL",
             "--coordinator-token-file": "SHUTDOWN_COORDINATOR_TOKEN_FILE",
             "--advertise-url": None}


# --- the engine's children: a SIGTERM that ends them cleanly -------------------------------


RECEIVE_POLL_MS = 100
"""How often a detokenizer or DP controller waiting for a message looks whether its SIGTERM
came (``_receive_until_stopped``)."""

LEAVE_WITHIN_S = 2.0
"""After its SIGTERM, a detokenizer or DP controller still there this much later exits 0
without waiting any longer (``os._exit``, which skips its exit cleanup and says so on
stderr: "forced exit", with the threads that held it): measured twice under heavy load, one
whose SIGTERM was received stayed 10 s, until SIGKILL."""

CLEAN_EXIT_LINE = "left its loop on SIGTERM; exit cleanup ran"
"""What a detokenizer or DP controller writes to stderr as the last of its exit handlers run
(``atexit``: after multiprocessing's own and after its threads were joined); a forced exit
never writes it."""

_stopping = threading.Event()
_role = "child"
"""What this process is (``sglang::detokenizer``, ``sglang::data_parallel_controller``), for
its lines on stderr."""


def _say(what: str) -> None:
    sys.stderr.write(f"{_role} {os.getpid()}: {what}\n")
    sys.stderr.flush()


def _forced_exit() -> None:
    held = [thread.name for thread in threading.enumerate()
            if not thread.daemon and thread is not threading.main_thread()]
    _say(f"forced exit {LEAVE_WITHIN_S:g} s after SIGTERM; threads still running: {held}")
    os._exit(0)


def _exit_cleanup_ran() -> None:
    if _stopping.is_set():
        _say(CLEAN_EXIT_LINE)


def _leave_on_sigterm(role: str) -> None:
    """In a detokenizer or DP controller, before SGLang's loop: SIGTERM leaves it (``_leave``)
    and the exit's last handler says the cleanup ran."""
    global _role
    _role = role
    signal.signal(signal.SIGTERM, _leave)
    atexit.register(_exit_cleanup_ran)


def _leave(signum: int, frame: Any) -> None:
    # The loops of these processes have no way out but a signal: leave them as a clean exit,
    # so multiprocessing's bootstrap runs its exit handlers and the process exits 0. Raised
    # here when Python code runs (the DP controller's loop polls); noted for the receive
    # below when the main thread waits in zmq; and a last resort that exits 0 regardless.
    if not _stopping.is_set():
        _stopping.set()
        last_resort = threading.Timer(LEAVE_WITHIN_S, _forced_exit)
        last_resort.daemon = True
        last_resort.start()
    raise SystemExit(0)


def _receive_until_stopped(receive: Callable[..., Any]) -> Callable[..., Any]:
    """SGLang's ``sock_recv``, waiting at most ``RECEIVE_POLL_MS`` at a time and leaving once
    the SIGTERM came. Measured: a SIGTERM that interrupted the detokenizer's blocking zmq
    receive did not end it (pyzmq 27 goes back to waiting; no exit in 10 s), so the wait
    itself must end."""
    import zmq  # type: ignore[import-not-found]  # SGLang's; only in the engine's environment

    def ready(socket: Any) -> bool:
        try:
            return bool(socket.poll(RECEIVE_POLL_MS, zmq.POLLIN))
        except zmq.error.InterruptedSystemCall:  # the signal: look at the flag
            return False

    def receive_until_stopped(socket: Any, flags: int = 0) -> Any:
        if not flags & zmq.NOBLOCK:
            while not ready(socket):
                if _stopping.is_set():
                    raise SystemExit(0)
        if _stopping.is_set():
            raise SystemExit(0)
        return receive(socket, flags)

    return receive_until_stopped


def run_detokenizer_until_sigterm(*args: Any, **kwargs: Any) -> None:
    """SGLang's detokenizer process, which leaves its loop and exits 0 on SIGTERM."""
    from sglang.srt.managers import detokenizer_manager

    _leave_on_sigterm("sglang::detokenizer")
    detokenizer_manager.sock_recv = _receive_until_stopped(detokenizer_manager.sock_recv)
    detokenizer_manager.run_detokenizer_process(*args, **kwargs)


def run_dp_controller_until_sigterm(*args: Any, **kwargs: Any) -> None:
    """SGLang's data-parallel controller, which exits 0 on SIGTERM (its schedulers, its own
    children, have left after ``ShutdownReq`` by then).

    Each scheduler is started from a thread of its own that SGLang never lets end
    (``launch_tensor_parallel_group_thread``: ``while True: time.sleep(30 days)``), because a
    scheduler's ``PR_SET_PDEATHSIG`` fires when the thread that started it ends. Those threads
    are not daemons, so the controller's exit would wait for them forever: here each waits
    for the SIGTERM and for every scheduler to be gone instead, then ends."""
    from sglang.srt.managers import data_parallel_controller

    controller = data_parallel_controller.DataParallelController
    controller.launch_tensor_parallel_group_thread = _hold_schedulers_until_stopped
    _leave_on_sigterm("sglang::data_parallel_controller")
    data_parallel_controller.sock_recv = _receive_until_stopped(
        data_parallel_controller.sock_recv)
    data_parallel_controller.run_data_parallel_controller_process(*args, **kwargs)


def _hold_schedulers_until_stopped(self: Any, server_args: Any, port_args: Any,
                                   base_gpu_id: int, dp_rank: int,
                                   ready_event: threading.Event) -> None:
    """``DataParallelController.launch_tensor_parallel_group_thread``, ending once the
    controller had its SIGTERM and no scheduler it started still runs (their ends are
    watched through their sentinels: the controller's exit reaps them)."""
    from multiprocessing.connection import wait

    self.launch_tensor_parallel_group(server_args, port_args, base_gpu_id, dp_rank)
    ready_event.set()
    _stopping.wait()
    for proc in self.scheduler_procs:
        if proc is not None:
            wait([proc.sentinel])


# --- the main process ----------------------------------------------------------------------


def _terminate_main_thread(pid: int) -> None:
    """SIGTERM to ``pid``'s main thread (``tgkill``), not to the process.

    A process-directed signal goes to any thread that does not block it: in the detokenizer,
    often SGLang's soft-watchdog thread, and then the main thread stays in its blocking zmq
    receive and the Python handler runs only when a message comes (measured: no exit within
    10 s, once in three runs). Sent to the main thread, the receive is interrupted (EINTR) and
    the handler runs at once."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, pid, signal.SIGTERM) != 0:
        error = ctypes.get_errno()
        if error != errno.ESRCH:  # gone already is what we want
            raise OSError(error, os.strerror(error))


def _children(names: tuple[str, ...]) -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            title = " ".join(child.cmdline()) or child.name()
            if any(title.startswith(name) for name in names):
                found.append(child)
    return found


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each of ``procs`` has exited, at most ``timeout_s``; return those still
    running. Each is watched through a pidfd, which becomes readable when the process exits,
    zombie or reaped: the DP schedulers are the controller's children, not this process's, and
    stay zombies until the controller reaps them at its own exit (``psutil.wait_procs`` would
    wait its whole timeout for them)."""
    loop = asyncio.get_running_loop()
    exits: dict[asyncio.Future[None], tuple[psutil.Process, int]] = {}
    try:
        for proc in procs:
            try:
                fd = os.pidfd_open(proc.pid)
            except ProcessLookupError:
                continue  # gone and reaped
            if not proc.is_running():  # its PID was reused before the pidfd: it is gone
                os.close(fd)
                continue
            exited: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _settle, exited)
            exits[exited] = (proc, fd)
        if exits:
            await asyncio.wait(exits, timeout=timeout_s)
        return [proc for exited, (proc, _) in exits.items() if not exited.done()]
    finally:
        for _, fd in exits.values():
            loop.remove_reader(fd)
            os.close(fd)


async def stop_engine(tokenizer_manager: Any) -> None:
    """The engine's children, in order, each ending cleanly (module docstring, step 3)."""
    from sglang.srt.managers.io_struct import ShutdownReq

    watchdog = getattr(tokenizer_manager, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    schedulers = _children(("sglang::scheduler",))
    tokenizer_manager._dispatch_to_scheduler(ShutdownReq())
    late = await _wait_gone(schedulers, SCHEDULER_EXIT_S)
    for proc in late:
        log.warning("scheduler %d still running %.0f s after ShutdownReq", proc.pid,
                    SCHEDULER_EXIT_S)
    for names in (("sglang::data_parallel_controller",), ("sglang::detokenizer",)):
        procs = _children(names)
        for proc in procs:
            _terminate_main_thread(proc.pid)
        for proc in await _wait_gone(procs, CHILD_EXIT_S):
            log.warning("%s %d still running after SIGTERM: SIGKILL", names[0], proc.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    log.info("engine stopped: every child has exited")


class Drainable:
    """What this module adds to SGLang's server, in one place."""

    def __init__(self, client: WorkerClient) -> None:
        self.client = client
        self.tokenizer_manager: Any = None
        self.completion_tokens: dict[str, int] = {}
        """rid → the engine's completion tokens in the last output it handed the serving
        layer (``count_tokens``): what the chunk that layer sends next carries."""

    def init_tokenizer_manager(self, init: Callable[..., Any]) -> Callable[..., Any]:
        """``launch_server``'s ``init_tokenizer_manager_func``: SGLang's, and then its
        SIGTERM handler replaced (step 3) and the pre-kill hook added (step 4)."""
        from sglang.srt.managers.tokenizer_manager import SignalHandler

        class LeaveSigtermToUvicorn(SignalHandler):  # type: ignore[misc]
            def sigterm_handler(self, signum: Any = None, frame: Any = None) -> None:
                log.info("SIGTERM: uvicorn stops, then the engine in order")

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = init(*args, **kwargs)
            manager = result[0] if isinstance(result, tuple) else result
            manager.signal_handler_class = LeaveSigtermToUvicorn
            manager.generate_request = self.count_tokens(manager.generate_request)
            self.tokenizer_manager = manager
            self.client.add_prekill_hook(self.stand_down)
            return result

        return wrapped

    def count_tokens(self, generate_request: Callable[..., Any]) -> Callable[..., Any]:
        """The tokenizer manager's ``generate_request``, noting each output's completion
        tokens under its rid before the serving layer turns it into a chunk."""

        async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            async for out in generate_request(*args, **kwargs):
                meta = out.get("meta_info") if isinstance(out, dict) else None
                if isinstance(meta, dict) and isinstance(meta.get("id"), str):
                    self.completion_tokens[meta["id"]] = int(
                        meta.get("completion_tokens") or 0)
                yield out

        return counted

    def stand_down(self) -> None:
        """Pre-kill hook: a child's exit is expected from now on, not a crash."""
        watchdog = getattr(self.tokenizer_manager, "_subprocess_watchdog", None)
        if watchdog is not None:
            watchdog.stop()

    def lifespan(self, inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """SGLang's lifespan, with the client started on the serving loop (after uvicorn
        installed its signal handlers, before the tokenizer manager adds its own at the first
        request) and the engine stopped in order when uvicorn stops."""

        @asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            async with inner(app):
                self.client.start()
                install_graceful_shutdown(self.client)
                try:
                    yield
                finally:
                    self.client.close()
                    if self.tokenizer_manager is not None:
                        await stop_engine(self.tokenizer_manager)

        return lifespan

    def middleware(self, app: Any) -> Any:
        return HandBack(app, self)


class HandBack:
    """ASGI middleware: each generation request tracked, handed back when a drain starts."""

    def __init__(self, app: Any, drainable: Drainable) -> None:
        self.app = app
        self.drainable = drainable

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] not in TRACKED_PATHS):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if not isinstance(request, dict) or not isinstance(request.get("rid", ""), str):
            # Not one request SGLang will stream (its own answer says what is wrong).
            await self.app(scope, _replay(body, receive), send)
            return
        headers = dict(scope.get("headers") or ())
        rid = request.get("rid") or (headers.get(b"x-request-id", b"").decode("latin-1")
                                     or f"drainable-{uuid.uuid4().hex}")
        request["rid"] = rid
        await self._tracked(scope, receive, send, rid, json.dumps(request).encode(),
                            streamed=bool(request.get("stream")))

    async def _tracked(self, scope: dict[str, Any], receive: Any, send: Any, rid: str,
                       body: bytes, *, streamed: bool) -> None:
        out: asyncio.Queue[tuple[dict[str, Any], int]] = asyncio.Queue()
        counts = self.drainable.completion_tokens

        async def queue(message: dict[str, Any]) -> None:
            # Each message with the engine's count when the serving layer made it.
            await out.put((message, counts.get(rid, 0)))

        started = False
        tokens = 0
        serving = asyncio.ensure_future(self.app(scope, _replay(body, receive), queue))
        try:
            async with self.drainable.client.track(rid) as req:
                while True:
                    message, made_at = await req.run(_next(out, serving))
                    if message["type"] == "http.response.start":
                        started = True
                    elif message["type"] == "http.response.body":
                        tokens = max(tokens, made_at)
                        req.tokens = tokens
                    await send(message)
                    if message["type"] == "http.response.body" and not message.get(
                            "more_body", False):
                        break
            if not req.handed_back:
                return
            manager = self.drainable.tokenizer_manager
            if manager is not None:
                manager.abort_request(rid=rid)
            log.info("handed back request %s after %d tokens", rid, tokens)
            event = handed_back_event(rid, tokens)
            line = f"data: {json.dumps(event)}\n\n".encode()
            if started:
                await send({"type": "http.response.body", "body": line, "more_body": False})
            elif streamed:
                # A stream handed back before its first token is still a stream that ends with
                # the event: routers and the continuation proxy acknowledge it and retry.
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream")]})
                await send({"type": "http.response.body", "body": line})
            else:
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"retry-after", b"0")]})
                await send({"type": "http.response.body", "body": json.dumps(event).encode()})
        finally:
            if not serving.done():
                serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            counts.pop(rid, None)


async def _next(out: asyncio.Queue[tuple[dict[str, Any], int]], serving: asyncio.Future[None]
                ) -> tuple[dict[str, Any], int]:
    """The app's next message; its own failure is raised here (it sent nothing more)."""
    getter = asyncio.ensure_future(out.get())
    try:
        await asyncio.wait((getter, serving), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        getter.cancel()
        raise
    if getter.done():
        return getter.result()
    getter.cancel()
    serving.result()  # raises what the app raised
    raise RuntimeError("the app ended without a complete response")


async def _read_body(receive: Any) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return bytes(body)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` once, then the connection's own messages."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # type: ignore[no-any-return]

    return replayed


@contextlib.contextmanager
def _uvicorn_without_reraise() -> Iterator[None]:
    """uvicorn re-raises the signal it stopped on once it has served (the process would die
    of SIGTERM, -15); a drained worker exits 0. SGLang builds its own ``uvicorn.Server``, so
    the class's ``capture_signals`` is replaced while it serves."""
    import uvicorn

    original = uvicorn.Server.capture_signals

    @contextlib.contextmanager
    def capture_signals(self: uvicorn.Server) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    uvicorn.Server.capture_signals = capture_signals  # type: ignore[method-assign]
    try:
        yield
    finally:
        uvicorn.Server.capture_signals = original  # type: ignore[method-assign]


def split_argv(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """This module's own flags, and SGLang's."""
    own: dict[str, str | None] = {flag: os.environ.get(env) if env else None
                                  for flag, env in OWN_FLAGS.items()}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag in OWN_FLAGS:
            own[flag] = value if eq else next(args, None)
        else:
            rest.append(arg)
    return own, rest


def main() -> None:
    from sglang.srt.entrypoints import engine as sglang_engine
    from sglang.srt.entrypoints import http_server
    from sglang.srt.server_args import prepare_server_args

    own, sglang_argv = split_argv(sys.argv[1:])
    server_args = prepare_server_args(sglang_argv)
    logging.basicConfig(level=logging.INFO)
    token = None
    if own["--coordinator-token-file"]:
        with open(own["--coordinator-token-file"], encoding="utf-8") as f:
            token = f.read().strip() or None
    # The main process first: it stops its own children in order (step 3).
    tiers = (Tier("sglang-main", pattern=r"drainable_server\.py", include_root=True,
                  timeout_s=MAIN_TIER_S),)
    client = WorkerClient(
        own["--coordinator"], token=token, role="sglang", name=f"sglang-{os.getpid()}",
        url=own["--advertise-url"] or f"http://{server_args.host}:{server_args.port}",
        tiers=tiers,
    )
    drainable = Drainable(client)
    app = http_server.app
    app.router.lifespan_context = drainable.lifespan(app.router.lifespan_context)
    app.add_middleware(drainable.middleware)
    # Engine._launch_subprocesses starts the DP controller by this module-level name; there
    # is no launch_server argument for it.
    sglang_engine.run_data_parallel_controller_process = run_dp_controller_until_sigterm
    started = time.monotonic()
    with _uvicorn_without_reraise():
        http_server.launch_server(
            server_args,
            init_tokenizer_manager_func=drainable.init_tokenizer_manager(
                http_server.init_tokenizer_manager),
            run_detokenizer_process_func=run_detokenizer_until_sigterm,
        )
    log.info("stopped after %.1f s", time.monotonic() - started)


if __name__ == "__main__":
    main()
