"""What the streaming handlers on the event loop (grpc.aio) share: blocking work off the loop, and blocking
work of many streams done together.

The loop only moves messages; every database call and every call that may wait runs on the loop's
default executor (the dispatcher's `stream` threads, ServerSettings.stream_workers), through `blocking`.
ADR 0004 says why.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from dispatcher.errors import StoreUnavailable

log = logging.getLogger(__name__)


def blocking(fn: Callable[..., Any], *args) -> asyncio.Future:
    """fn(*args) on the loop's executor, awaited without holding the loop."""
    return asyncio.get_running_loop().run_in_executor(None, fn, *args)


def from_thread(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], Any]) -> None:
    """fn() on `loop`, asked from another thread; nothing when there is no loop yet or it closed (a server
    stopping)."""
    if loop is None:
        return
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # closed
        pass


class Coalescer:
    """Calls from many coroutines done together: `await coalescer(item)` queues the item, and one blocking
    `flush(items)` (on the executor) does every item queued while the one before it ran, returning one result
    per item in order (an exception among them is raised in its own caller). One flush at a time: under
    load the batches grow by themselves, when idle a batch is one item, at once.

    A flush that raises is tried again one item at a time, so one bad item fails its own call only; except
    when the store is unreachable, which every item would meet alike: that fails the whole batch at once.
    """

    def __init__(self, flush: Callable[[list], list], *, most: int = 1000, name: str = "coalescer"):
        self._flush = flush
        self._most = most
        self._name = name
        self._waiting: list[tuple[Any, asyncio.Future]] = []
        self._draining: asyncio.Task | None = None

    async def __call__(self, item):
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain(), name=self._name)
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:self._most], self._waiting[self._most:]
                batch = [(item, future) for item, future in batch if not future.done()]  # a caller gone (cancelled)
                if not batch:
                    continue
                try:
                    results = await blocking(self._flush, [item for item, _ in batch])
                except Exception as exc:
                    if len(batch) == 1 or isinstance(exc, StoreUnavailable):
                        for _, future in batch:
                            _settle(future, exception=exc)
                        continue
                    log.warning("%s: a batch of %d failed; trying its items one by one", self._name, len(batch),
                                exc_info=True)
                    for item, future in batch:
                        try:
                            _settle(future, (await blocking(self._flush, [item]))[0])
                        except Exception as one:
                            _settle(future, exception=one)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if isinstance(result, BaseException):
                        _settle(future, exception=result)
                    else:
                        _settle(future, result)
        finally:
            self._draining = None


def _settle(future: asyncio.Future, result=None, *, exception: BaseException | None = None) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


class Rerun:
    """fn() on a thread of its own when asked (`ask()`, from any thread): asks made while it runs are all
    answered by one more run after it, so a burst of asks (a thousand new clusters' first reports) costs two
    runs, not a thousand threads at once."""

    def __init__(self, fn: Callable[[], None], *, name: str):
        self._fn = fn
        self._name = name
        self._lock = threading.Lock()
        self._running = False
        self._again = False

    def ask(self) -> None:
        with self._lock:
            if self._running:
                self._again = True
                return
            self._running = True
        threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                self._fn()
            finally:
                with self._lock:
                    again, self._again = self._again, False
                    if not again:
                        self._running = False
            if not again:
                return
