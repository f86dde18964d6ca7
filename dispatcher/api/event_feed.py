"""The job events every watch stream of this process sends, read from the store once for all of them.

A thousand open watches (Jobs.Watch and WatchBatches) must not mean a thousand reads of job_events for
every event written. One reader follows the table's tail while any watch is open; each watch takes the
rows it wants from the feed's recent rows, in memory. A watch that resumes from an older event id, or
falls further behind than the rows kept (a client that does not read), reads what it missed from the store
(`stored`), then follows the feed again. Those reads are shared too: after a restart every watch resumes at
once from about the same event, and each reading and converting the same rows alone kept the event loop
busy for minutes.

Event ids are taken when a transaction inserts, not when it commits, so an id below the tail may still
appear (a longer transaction commits after a shorter, later one). The ids skipped over are asked for again
until GAP_WAIT_S has passed (an id of a rolled-back transaction never appears); the feed passes such a
late row on like any other. A feed that starts waits so for the ids missing among the MAX_GAPS below the
newest event then.
"""
from __future__ import annotations

import asyncio
import bisect
import functools
import itertools
import time
from collections import Counter, OrderedDict, deque
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
# While the loop runs late (the pause ended LATE_S or more after its time), the pause doubles, up to this long per
# open watch and PACE_BUSY_MOST_S in all, and halves back once the loop keeps time: fewer, larger sends leave the
# loop to what is waiting (a restart's agents dialling in: docs/performance.md, issue 26).
LATE_S = 0.05
PACE_BUSY_PER_WATCH_S = 0.005
PACE_BUSY_MOST_S = 5.0
WAKE_AT_ONCE = 20  # watches woken in one turn of the event loop...
WAKE_SPREAD = 0.5  # ...in groups spread over this part of the pause between two reads
_EVENTS_FIELD = b"\x0a"  # JobEvents.events: field 1, length-delimited
STORED_BLOCKS = 20  # blocks of READ stored rows kept for the watches catching up (as many rows as `keep`)


@dataclass(frozen=True)
class Place:
    """Where a watch joined the feed: rows after `seq` are new to it; everything up to event id `head` (and
    the ids in `gaps`, which may still come) it reads from the store if it wants them."""
    seq: int
    head: int
    gaps: frozenset[int]


@dataclass(frozen=True)
class _Block:
    """Stored rows read for the watches catching up (EventFeed.stored): every row after the id the block
    follows up to `through` is in `chunk`."""
    chunk: Chunk
    through: int

    @property
    def whole(self) -> bool:
        """READ rows: a read again would bring the same."""
        return len(self.chunk.rows) == READ


class Chunk:
    """The rows one read brought (or the end of them): each with its JobEvent, made once for every watch, and
    the messages WatchBatches sends of them, made once for every watch too, whichever of the rows it takes."""

    def __init__(self, first: int, rows: list[tuple[object, jobs_pb2.JobEvent]], before: Place | None = None,
                 *, source: tuple[Chunk, int] | None = None):
        self.first = first  # the feed's seq of the first row
        self.rows = rows
        self.before = before  # where a watch joined just before this read (the feed's chunks only)
        self._source = source  # the chunk these rows were cut from, and where: what is made of them is theirs
        self._batches: list[jobs_pb2.JobEvents] | None = None
        self._serialized_events: list[bytes] | None = None
        self._wire: list[bytes] | None = None

    @functools.cached_property
    def event_ids(self) -> list[int]:
        """Each row's event id, in order."""
        if self._source is not None:
            whole, start = self._source
            return whole.event_ids[start:start + len(self.rows)]
        return [row.id for row, _ in self.rows]

    @functools.cached_property
    def lowest_id(self) -> int:
        return min(self.event_ids)

    @functools.cached_property
    def highest_id(self) -> int:
        return max(self.event_ids)

    @functools.cached_property
    def ids(self) -> frozenset[int]:
        return frozenset(self.event_ids)

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1

    def cut(self, start: int, stop: int | None = None, first: int = 0) -> Chunk:
        """rows[start:stop] as a chunk (`first`: the feed's seq of its first row) sharing this one's serialized
        events: after a restart a thousand watches resume each from its own event, and each cut made its own."""
        return Chunk(first, self.rows[start:stop], source=(self, start))

    def batches(self) -> list[jobs_pb2.JobEvents]:
        if self._batches is None:
            self._batches = batched([event for _, event in self.rows])
        return self._batches

    def wire(self) -> list[bytes]:
        """Every row's event as JobEvents messages already serialized, made once for every WatchBatches that sends
        them all: gRPC would serialize each message again for each watch, a thousand times a read, on the loop
        (JobsService.add_to)."""
        if self._wire is None:
            self._wire = _joined(self._serialized())
        return self._wire

    def of(self, keep: list[int], *, wire: bool) -> list:
        """The messages of the rows at the indices `keep` alone (a watch of one job, of a user's queues): as
        wire() makes them, of the same serialized events, or as JobEvents."""
        if not wire:
            return batched([self.rows[i][1] for i in keep])
        framed = self._serialized()
        return _joined([framed[i] for i in keep])

    def _serialized(self) -> list[bytes]:
        """Each row's event framed as inside a JobEvents message, serialized once for every watch and cut."""
        if self._serialized_events is None:
            if self._source is not None:
                whole, start = self._source
                self._serialized_events = whole._serialized()[start:start + len(self.rows)]
            else:
                self._serialized_events = [_framed_event(event) for _, event in self.rows]
        return self._serialized_events


def batched(events: list[jobs_pb2.JobEvent]) -> list[jobs_pb2.JobEvents]:
    """Events as WatchBatches sends them: in runs of up to streams.RUN_BYTES, one message a run."""
    return [jobs_pb2.JobEvents(events=run) for run in streams.runs(events)]


def _framed_event(event: jobs_pb2.JobEvent) -> bytes:
    """The event as it is inside a serialized JobEvents message (field 1, length-delimited). A JobEvents has no
    other field, so its serialization is its events' so framed, one after another: any run of them is joined."""
    body = event.SerializeToString()
    size, length = len(body), bytearray()
    while size > 0x7F:  # the length as a varint
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return _EVENTS_FIELD + bytes(length) + body


def _joined(framed_events: list[bytes]) -> list[bytes]:
    """Framed events as serialized JobEvents messages, in runs of up to streams.RUN_BYTES, as batched() makes them."""
    if sum(map(len, framed_events)) <= streams.RUN_BYTES:  # one message (the usual): no loop in Python per event
        return [b"".join(framed_events)] if framed_events else []
    return [b"".join(run) for run in streams.runs(framed_events, size=len)]


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
        self._pacing = Pacing()
        self._reader: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the watches' (set by the first)
        self._starting = asyncio.Lock()
        self._woken = asyncio.Event()  # a notification: events were committed
        self._waiting: set[asyncio.Future] = set()  # the watches waiting for rows (wait())
        self._unsubscribe = None
        self._failed: Exception | None = None
        self._blocks: OrderedDict[int, _Block] = OrderedDict()  # stored rows by the id they follow (stored())
        self._block_reads: dict[int, asyncio.Future] = {}  # the reads of blocks under way
        # Reads of the store for the watches (/metrics): `tail` follows new events, `shared` reads a block of
        # older ones for every watch catching up, `alone` one watch's own (a job's events, rows below a gap).
        self.reads: Counter[str] = Counter(tail=0, shared=0, alone=0)

    async def join(self, after: int = 0) -> Place:
        """Follow the feed (leave() when done), from where it still keeps every row after event id `after`,
        if it does: the rows before that the watch reads from the store."""
        self._watching += 1
        try:
            async with self._starting:
                if self._reader is None:
                    loop = self._loop = asyncio.get_running_loop()
                    self._unsubscribe = self._notifier.subscribe(
                        channels.EVENTS_CHANNEL, lambda _payload: loop.call_soon_threadsafe(self._woken.set))
                    self._head, missing = await blocking(self._start)
                    now = time.monotonic()
                    self._gaps = dict.fromkeys(missing, now)
                    self._chunks.clear()  # a reader before this one's: rows up to its head only, not to this one's
                    self._kept = 0
                    self._failed = None
                    self._reader = asyncio.create_task(self._follow(), name="event-feed")
        except BaseException:
            self.leave()
            raise
        # The newest read this watch needs all of: after a restart, watches joining over some seconds all read
        # the store only up to where the feed began, the same rows for each, and the rest from memory.
        for chunk in reversed(self._chunks):
            if chunk.before.head <= after:
                return chunk.before
        return self._chunks[0].before if self._chunks else self.place()

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
            new[0] = new[0].cut(seq + 1 - new[0].first, first=seq + 1)
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

    async def stored(self, after: int, through: int, job_id: int = 0) -> Chunk | None:
        """The stored rows after event id `after` up to `through` (of job `job_id`, or of every job), READ at
        most; None when there are none.

        The rows of every job are read in blocks of READ, each read once and made into messages once for every
        watch that catches up through it, and the blocks kept (STORED_BLOCKS) with the id up to which they
        hold every row: one below the feed's oldest gap then, as no id under it can still appear. The last block
        before the feed's head is short; it is kept too, or a thousand watches resuming together would each read
        and convert it alone. Other rows each watch reads alone."""
        if not job_id:
            start = after - after % READ
            block = self._blocks.get(start)
            if block is None or not block.whole and block.through < min(through, self._settled()):  # would hold more
                block = await self._block(start)
            if block is not None:
                rows = block.chunk.rows
                if block.chunk.lowest_id > after and block.chunk.highest_id <= through:
                    return block.chunk
                start, stop = (bisect.bisect_right(rows, after, key=_event_id),
                               bisect.bisect_right(rows, through, key=_event_id))
                if start < stop:
                    return block.chunk.cut(start, stop)
                if block.through >= through:
                    return None
                # The rows above the block's, up to `through`, may still change (below a gap): read alone.
        self.reads["alone"] += 1
        rows = await blocking(self._read_stored, after, through, job_id)
        return Chunk(0, rows) if rows else None

    def _settled(self) -> int:
        """The highest event id up to which every row is stored for good: below the oldest gap, up to the head."""
        return min(self._head, min(self._gaps, default=self._head + 1) - 1)

    async def _block(self, start: int) -> _Block | None:
        """The stored rows after event id `start` that can no longer change, READ at most, read once for every
        watch asking at the same time, and kept."""
        if (reading := self._block_reads.get(start)) is None:
            reading = self._block_reads[start] = asyncio.ensure_future(self._read_block(start))
            reading.add_done_callback(lambda _: self._block_reads.pop(start, None))
        return await asyncio.shield(reading)  # a watch that ends does not end the others' read

    async def _read_block(self, start: int) -> _Block | None:
        settled = self._settled()
        self.reads["shared"] += 1
        rows = await blocking(self._read_stored, start, settled, 0)
        if not rows:
            return None
        chunk = Chunk(0, rows)
        block = self._blocks[start] = _Block(chunk, chunk.highest_id if len(rows) == READ else settled)
        self._blocks.move_to_end(start)
        while len(self._blocks) > STORED_BLOCKS:
            self._blocks.popitem(last=False)
        return block

    def _read_stored(self, after: int, through: int, job_id: int) -> list[tuple[object, jobs_pb2.JobEvent]]:
        return self._events(job_id=job_id, after_id=after, through_id=through)

    def _start(self) -> tuple[int, list[int]]:
        """The newest event id, and the ids below it no event has yet: a transaction still open may commit one
        (as the ids skipped over later)."""
        with self._one_statement() as session:
            head = job_reads.last_event_id(session)
            return head, job_reads.missing_event_ids(session, head, MAX_GAPS)

    def _read(self, after: int, also: list[int]) -> list[tuple[object, jobs_pb2.JobEvent]]:
        return self._events(after_id=after, also=also)

    def _events(self, **query) -> list[tuple[object, jobs_pb2.JobEvent]]:
        """READ rows of job_reads.events at most, each with its JobEvent: made here, on a stream thread, as a
        thousand made on the loop would hold it for tens of milliseconds, and every call waiting to be taken up."""
        with self._one_statement() as session:
            rows = job_reads.events(session, with_owner=True, limit=READ, **query)
        return [(row, convert.event(row)) for row in rows]

    def _add(self, rows: list[tuple[object, jobs_pb2.JobEvent]], before: Place) -> None:
        self._chunks.append(Chunk(self._seq + 1, rows, before))
        self._seq += len(rows)
        self._kept += len(rows)
        while self._kept - len(self._chunks[0].rows) >= self._keep:
            self._kept -= len(self._chunks.popleft().rows)

    async def _follow(self) -> None:
        try:
            while self._watching > 0:
                self._woken.clear()
                self.reads["tail"] += 1
                rows = await blocking(self._read, self._head, list(self._gaps))
                before = self.place()
                now = time.monotonic()
                for row, _ in rows:
                    if row.id in self._gaps:
                        del self._gaps[row.id]
                    else:
                        if row.id - self._head <= MAX_GAPS:
                            self._gaps.update(dict.fromkeys(range(self._head + 1, row.id), now))
                        self._head = row.id
                for gap in [g for g, since in self._gaps.items() if now - since > GAP_WAIT_S]:
                    del self._gaps[gap]
                if rows:
                    self._add(rows, before)
                    # Every watch sends what each read brings: reads far apart send more at a time. With many
                    # watches open the reads are spaced (up to PACE_MOST_S), bounding the messages sent a second,
                    # and the watches are woken over the first part of the pause.
                    loop = asyncio.get_running_loop()
                    began, pause = loop.time(), self._pacing.pause(self._watching)
                    await self._wake_watches(pause * WAKE_SPREAD)
                    await asyncio.sleep(max(0.0, began + pause - loop.time()))
                    self._pacing.ended(pause, late_s=loop.time() - (began + pause))
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
            self._blocks.clear()
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None


class Pacing:
    """The pause after a feed's read that found rows: PACE_PER_WATCH_S per open watch (PACE_MOST_S at most), longer
    while the loop runs late."""

    def __init__(self):
        self._longer = 0.0

    def pause(self, watching: int) -> float:
        usual = min(PACE_MOST_S, PACE_PER_WATCH_S * watching)
        return max(usual, min(self._longer, PACE_BUSY_MOST_S, PACE_BUSY_PER_WATCH_S * watching))

    def ended(self, pause: float, late_s: float) -> None:
        """A pause ended `late_s` after its time: the next is twice as long if that was LATE_S or more, else half."""
        self._longer = pause * 2 if late_s >= LATE_S else pause / 2


def _event_id(pair: tuple[object, jobs_pb2.JobEvent]) -> int:
    return pair[0].id


def _settle(arrived: asyncio.Future) -> None:
    """End a watch's wait (rows came, or its time is up), unless it ended already."""
    if not arrived.done():
        arrived.set_result(None)
