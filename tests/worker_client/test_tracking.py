"""Request tracking: a drain ends each generation and hands the request back (no coordinator)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from worker_client import HandedBack, WorkerClient


async def tokens(n: int, step: asyncio.Event | None = None) -> AsyncIterator[str]:
    """A generation that waits for ``step`` before each token (forever when never set)."""
    for i in range(n):
        if step is not None:
            await step.wait()
            step.clear()
        else:
            await asyncio.sleep(0)
        yield f"t{i}"


class Stalling:
    """A generation of 2 tokens that then waits for ever; says whether it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = False

    async def __call__(self) -> AsyncIterator[str]:
        yield "t0"
        yield "t1"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        yield "t2"


@pytest.fixture
async def client() -> AsyncIterator[WorkerClient]:
    c = WorkerClient(None).start()
    yield c
    c.close()


async def test_untouched_request_completes(client: WorkerClient) -> None:
    """1. Track a request and stream 5 tokens with no drain.
    2. All 5 arrive, nothing is handed back, nothing stays in flight."""
    async with client.track("r1") as req:
        got = [t async for t in req.stream(tokens(5))]
    assert got == [f"t{i}" for i in range(5)]
    assert not req.handed_back
    assert req.tokens == 5
    assert client.inflight == 0


async def test_drain_interrupts_a_waiting_generation(client: WorkerClient) -> None:
    """1. Start a request whose generation produces 2 tokens and then waits.
    2. Start a drain.
    3. The generation is cancelled where it waits; the request is handed back after 2 tokens;
       shutdown_event is set."""
    got: list[str] = []
    two_tokens = asyncio.Event()
    generation = Stalling()

    async def handler() -> None:
        async with client.track("r2") as req:
            async for t in req.stream(generation()):
                got.append(t)
                if len(got) == 2:
                    two_tokens.set()
        assert req.handed_back
        assert req.tokens == 2

    task = asyncio.create_task(handler())
    await two_tokens.wait()
    await asyncio.sleep(0)
    client.start_local_drain("test")
    await asyncio.wait_for(task, 10)
    assert got == ["t0", "t1"]
    assert client.shutdown_event.is_set()
    assert generation.cancelled
    assert client.inflight == 0


async def test_drain_interrupts_a_stream_stepped_in_tasks_of_its_own(
        client: WorkerClient) -> None:
    """1. A consumer awaits each step of a tracked stream in a task of its own (as vLLM's
       ``merge_async_iterators`` does), and gets 2 tokens.
    2. Its third step waits in the generation; a drain starts.
    3. That step's task is cancelled where it waits: the stream ends, handed back after 2
       tokens, the generation saw the cancellation."""
    generation = Stalling()
    async with client.track("r4") as req:
        items = req.stream(generation())

        async def step() -> str:
            return await anext(items)

        got = [await asyncio.create_task(step()), await asyncio.create_task(step())]
        third = asyncio.create_task(step())
        await asyncio.sleep(0)
        client.start_local_drain("test")
        done, _ = await asyncio.wait({third}, timeout=10)
        assert done == {third}, "the step waiting in the generation was not interrupted"
        with pytest.raises(StopAsyncIteration):
            third.result()
    assert got == ["t0", "t1"]
    assert req.handed_back
    assert req.tokens == 2
    assert generation.cancelled
    assert client.inflight == 0


async def test_a_swallowed_cancellation_still_hands_back(client: WorkerClient) -> None:
    """1. A request's handler swallows a cancellation of its own task without ``uncancel()``
       (its task's ``cancelling()`` stays raised), then waits for its next token.
    2. A drain starts; the next token comes.
    3. The request is handed back, and its count of tokens is the tokens it delivered."""
    step = asyncio.Event()
    waiting = asyncio.Event()
    got: list[str] = []
    seen: dict[str, tuple[bool, int]] = {}

    async def handler() -> None:
        async with client.track("r5") as req:
            async for t in req.stream(tokens(10, step)):
                got.append(t)
                if len(got) == 1:
                    current = asyncio.current_task()
                    assert current is not None
                    current.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0)
                    waiting.set()
        seen["end"] = (req.handed_back, req.tokens)

    task = asyncio.create_task(handler())
    step.set()
    await waiting.wait()
    await asyncio.sleep(0)
    client.start_local_drain("test")
    await asyncio.wait_for(client.shutdown_event.wait(), 10)
    step.set()
    await asyncio.wait_for(task, 10)
    assert seen["end"] == (True, len(got))
    assert got == [f"t{i}" for i in range(len(got))]
    assert client.inflight == 0


async def test_drain_before_the_request_id_exists(client: WorkerClient) -> None:
    """1. Enter the tracked scope without a request id.
    2. The drain starts before the engine assigns the id.
    3. The id is assigned, the generation is asked for: it never starts; handed back, 0 tokens."""
    started = False

    async def generation() -> AsyncIterator[str]:
        nonlocal started
        started = True
        yield "never"

    async with client.track() as req:
        client.start_local_drain("test")
        await asyncio.wait_for(client.shutdown_event.wait(), 10)
        req.request_id = "assigned-late"
        got = [t async for t in req.stream(generation())]
    assert got == []
    assert not started
    assert req.handed_back
    assert (req.request_id, req.tokens) == ("assigned-late", 0)


async def test_request_cancellation_wins_over_the_drain(client: WorkerClient) -> None:
    """1. A request waits in its generation.
    2. The request's own task is cancelled (client went away) and the drain starts at once.
    3. The cancellation propagates (the request is not handed back)."""
    step = asyncio.Event()
    entered = asyncio.Event()
    seen: dict[str, bool] = {}

    async def handler() -> None:
        async with client.track("r3") as req:
            entered.set()
            async for _ in req.stream(tokens(10, step)):
                pass
        seen["handed_back"] = req.handed_back

    task = asyncio.create_task(handler())
    await entered.wait()
    await asyncio.sleep(0)
    task.cancel()
    client.start_local_drain("test")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "handed_back" not in seen
    assert client.inflight == 0


async def test_run_and_decorators(client: WorkerClient) -> None:
    """1. A tracked coroutine and a tracked stream complete normally while serving.
    2. After a drain starts, both raise HandedBack at once; the scope form absorbs it."""

    @client.tracked
    async def whole(request_id: str) -> str:
        return "done"

    @client.tracked_stream
    async def streamed(request_id: str) -> AsyncIterator[str]:
        yield "a"
        yield "b"

    assert await whole(request_id="x") == "done"
    assert [t async for t in streamed(request_id="y")] == ["a", "b"]
    client.start_local_drain("test")
    await asyncio.wait_for(client.shutdown_event.wait(), 10)
    with pytest.raises(HandedBack):
        await whole(request_id="x2")
    with pytest.raises(HandedBack):
        _ = [t async for t in streamed(request_id="y2")]
    async with client.track("z") as req:
        await req.run(asyncio.sleep(0))
        raise AssertionError("not reached: run raised HandedBack")
    assert req.handed_back


def test_threading_api_without_a_loop() -> None:
    """1. A client with no event loop (an engine that is not asyncio).
    2. A local drain sets ``draining`` and the tracked request sees ``shutting_down``."""
    client = WorkerClient(None).start()
    try:
        with client.track("s1") as req:
            before = req.shutting_down
            client.start_local_drain("test")
            assert client.draining.wait(5)
            assert req.shutting_down
            req.hand_back()
        assert not before
        assert client.inflight == 0
        assert client.shutdown_event.is_set()
    finally:
        client.close()
