"""The job events every watch stream of this process sends, read from the store once for all of them.

A thousand open watches (Jobs.Watch and WatchBatches) must not mean a thousand reads of job_events for
every event written. One reader follows the table's tail while any watch is open; each watch takes the
rows it wants from the feed's recent rows, in memory. A watch that resumes from an older event id, or
falls further behind than the rows kept (a client that does not read), reads what it missed from the store itself,
then follows the feed again.

Event ids are taken when a transaction inserts, not when it commits, so an id below the tail may still
appear (a longer transaction commits after a shorter, later one). The ids skipped over are asked for again
until GAP_WAIT_S has passed (an id of a rolled-back transaction never appears); the feed passes such a
late row on like any other.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass

from dispatcher.api import convert, streams
from dispatcher.api.asynchronous import blocking, from_thread
from dispatcher.store import channels, database, job_reads
from dispatcher.store.database import Sessions
from dispatcher.store.listening import Notifier
from sluice.v1 import jobs_pb2

GAP_WAIT_S = 10.0  # how long an event id skipped over is waited for
MAX_GAPS = 10_000  # a longer jump of ids is not waited for
READ = 1000  # rows read at once
IDLE_READ_S = 1.0  # a read at least this often while watches are open (a notification may be lost)
PACE_PER_WATCH_S = 0.001  # after a read that found rows, the next waits this long per open watch...
PACE_MOST_S = 1.0  # ...or this, at most (from 1,000 watches on): an event reaches a watch within about a second
WAKE_AT_ONCE = 20  # watches woken in one turn of the event loop...
WAKE_SPREAD = 0.5  # ...in groups spread over this part of the pause between two reads


@dataclass(frozen=True)
class Place:
    """Where a watch joined the feed: rows after `seq` are new to it; everything up to event id `head` (and
    the ids in `gaps`, which may still come) it reads from the store if it wants them."""
    seq: int
    head: int
    gaps: frozenset[int]


class Chunk:
    """The rows one read brought (or the end of them): each with its JobEvent, made once for every watch, and
    the JobEvents messages WatchBatches sends of them all, made once for every watch that takes them all."""

    def __init__(self, first: int, rows: list[tuple[object, jobs_pb2.JobEvent]]):
        self.first = first  # the feed's seq of the first row
        self.rows = rows
        self.lowest_id = min(row.id for row, _ in rows)
        self.highest_id = max(row.id for row, _ in rows)
        self._batches: list[jobs_pb2.JobEvents] | None = None

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1

    def batches(self) -> list[jobs_pb2.JobEvents]:
        if self._batches is None:
            self._batches = batched([event for _, event in self.rows])
        return self._batches


def batched(events: list[jobs_pb2.JobEvent]) -> list[jobs_pb2.JobEvents]:
    """Events as WatchBatches sends them: in runs of up to streams.RUN_BYTES, one message a run."""
    return [jobs_pb2.JobEvents(events=run) for run in streams.runs(events)]


class EventFeed:
    def __init__(self, sessions: Sessions, notifier: Notifier, *, keep: int = 20_000):
        """keep: the recent rows kept for the watches following the feed."""
        self._one_statement = database.autocommit(sessions)
        self._notifier = notifier
        self._keep = keep
        self._chunks: deque[Chunk] = deque()  # the rows of each read, oldest first
        self._kept = 0  # rows in _chunks
        self._seq = 0
        self._head = 0
        self._gaps: dict[int, float] = {}
        self._watching = 0
        self._reader: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the watches' (set by the first)
        self._starting = asyncio.Lock()
        self._woken = asyncio.Event()  # a notification: events were committed
        self._waiting: set[asyncio.Future] = set()  # the watches waiting for rows (wait())
        self._unsubscribe = None
        self._failed: Exception | None = None

    async def join(self) -> Place:
        """Follow the feed from now on (leave() when done)."""
        self._watching += 1
        try:
            async with self._starting:
                if self._reader is None:
                    loop = self._loop = asyncio.get_running_loop()
                    self._unsubscribe = self._notifier.subscribe(
                        channels.EVENTS_CHANNEL, lambda _payload: loop.call_soon_threadsafe(self._woken.set))
                    self._head = await blocking(self._last_id)
                    self._gaps.clear()
                    self._failed = None
                    self._reader = asyncio.create_task(self._follow(), name="event-feed")
        except BaseException:
            self.leave()
            raise
        return self.place()

    def leave(self) -> None:
        self._watching -= 1

    def place(self) -> Place:
        """Where a watch that fell behind joins again."""
        return Place(self._seq, self._head, frozenset(self._gaps))

    def since(self, seq: int) -> tuple[list[Chunk], int, bool]:
        """The rows added after `seq`, as the chunks they came in (the first one cut to them), the feed's seq
        now, and whether some of the rows after `seq` are no longer kept (the caller must read the store from
        where it was). Raises what stopped the feed's reader (the store unreachable): every watch ends with it,
        and the next to join starts a reader again."""
        if self._failed is not None:
            raise self._failed
        if seq >= self._seq:
            return [], seq, False
        lost = not self._chunks or self._chunks[0].first > seq + 1
        new = list(itertools.takewhile(lambda chunk: chunk.last > seq, reversed(self._chunks)))  # newest back
        new.reverse()
        if new and new[0].first <= seq:
            new[0] = Chunk(seq + 1, new[0].rows[seq + 1 - new[0].first:])
        return new, self._seq, lost

    async def wait(self, timeout_s: float) -> None:
        """Until rows are added, or timeout_s."""
        loop = asyncio.get_running_loop()
        arrived = loop.create_future()
        # A timer rather than asyncio.wait_for: a thousand watches wait after every read, and wait_for's
        # waiter future and callback would be two more turns of the loop for each.
        timer = loop.call_later(timeout_s, _settle, arrived)
        self._waiting.add(arrived)
        try:
            await arrived
        finally:
            timer.cancel()
            self._waiting.discard(arrived)

    def wake_soon(self) -> None:
        """End every watch's wait at once (from any thread)."""
        from_thread(self._loop, lambda: [_settle(arrived) for arrived in self._waiting])

    async def _wake_watches(self, spread_s: float = 0.0) -> None:
        """Wake the waiting watches WAKE_AT_ONCE at a time, the groups spread evenly over spread_s: a thousand
        watches sending at once fill the loop for a few hundred milliseconds, and every unary call's messages
        would wait behind them; paced, a call waits behind one group at most."""
        waiting, self._waiting = self._waiting, set()
        groups = -(-len(waiting) // WAKE_AT_ONCE)
        between = spread_s / groups if groups > 1 else 0.0
        for n, arrived in enumerate(waiting, 1):
            _settle(arrived)
            if n % WAKE_AT_ONCE == 0:
                await asyncio.sleep(between)

    def _last_id(self) -> int:
        with self._one_statement() as session:
            return job_reads.last_event_id(session)

    def _read(self, after: int, also: list[int]) -> list:
        with self._one_statement() as session:
            return job_reads.events(session, after_id=after, also=also, with_owner=True, limit=READ)

    def _add(self, rows: list) -> None:
        self._chunks.append(Chunk(self._seq + 1, [(row, convert.event(row)) for row in rows]))
        self._seq += len(rows)
        self._kept += len(rows)
        while self._kept - len(self._chunks[0].rows) >= self._keep:
            self._kept -= len(self._chunks.popleft().rows)

    async def _follow(self) -> None:
        try:
            while self._watching > 0:
                self._woken.clear()
                rows = await blocking(self._read, self._head, list(self._gaps))
                now = time.monotonic()
                for row in rows:
                    if row.id in self._gaps:
                        del self._gaps[row.id]
                    else:
                        if row.id - self._head <= MAX_GAPS:
                            self._gaps.update(dict.fromkeys(range(self._head + 1, row.id), now))
                        self._head = row.id
                for gap in [g for g, since in self._gaps.items() if now - since > GAP_WAIT_S]:
                    del self._gaps[gap]
                if rows:
                    self._add(rows)
                    # Every watch sends what each read brings: reads far apart send more at a time. With many
                    # watches open the reads are spaced (up to PACE_MOST_S), bounding the messages sent a second,
                    # and the watches are woken over the first part of the pause.
                    loop = asyncio.get_running_loop()
                    began, pause = loop.time(), min(PACE_MOST_S, PACE_PER_WATCH_S * self._watching)
                    await self._wake_watches(pause * WAKE_SPREAD)
                    await asyncio.sleep(max(0.0, began + pause - loop.time()))
                if len(rows) == READ:
                    continue
                try:
                    await asyncio.wait_for(self._woken.wait(), 0.1 if self._gaps else IDLE_READ_S)
                except TimeoutError:
                    pass
        except Exception as exc:
            self._failed = exc
            await self._wake_watches()
        finally:
            self._reader = None
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None


def _settle(arrived: asyncio.Future) -> None:
    """End a watch's wait (rows came, or its time is up), unless it ended already."""
    if not arrived.done():
        arrived.set_result(None)
