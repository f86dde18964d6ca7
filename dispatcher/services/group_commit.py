"""The submit fast path: concurrent Submit calls written in shared transactions (group commit).

The first caller in writes every call waiting at that moment in one transaction, validated against what
that transaction reads (submitting.SubmitConfig), and each call is answered after the commit with its
own ids or its own error: under load N commits, N reads of the classes, queues and clusters and N pairs
of notifications become one of each. A write of many jobs hands on to the next once its rows are made,
so one group's validating overlaps another's insert (two at most). A write of a few jobs goes in one
round trip when it can (`_write_at_once`). The submit benchmarks (docs/performance.md) are what each of
these mechanisms is kept for; tests/integration/test_submit_groups.py and test_submit_at_once.py hold
them to what `submitting.submit` writes for the same calls.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from dispatcher.errors import Conflict, DispatcherError, InvalidRequest
from dispatcher.services import waiting
from dispatcher.services.submitting import MAX_SUBMIT, SubmitConfig, Whole, parse
from dispatcher.store import database, lifecycle, submit_keys
from dispatcher.store.database import Sessions
from dispatcher.store.tokens import Principal
from sluice.spec import JobSpec

WRITES = 2  # write transactions under way at once: one's rows go to Postgres while the next is validated
# Jobs in a write from which it hands on before its insert (see Submitter._write): the writes that go by
# COPY, which draw their ids before it, so the groups' ids still follow their order.
HAND_ON_EARLY_FROM = lifecycle.COPY_FROM


@dataclass(frozen=True)
class Submitted:
    """A submit's answer: its jobs' ids; replayed: they are an earlier submit's with the same key."""

    ids: list[int]
    replayed: bool = False


class Submitter:
    """Submit calls from many threads, written in shared transactions (group commit).

    A call queues its ticket; if no write is under way it writes every queued ticket itself, else it waits
    for the writer, which hands the next write to the first ticket still queued when it is done, or, for a
    write of many jobs, once its rows are made (validated and ready to insert): the next group then reads
    and validates while this one's rows go to Postgres. At most WRITES writes are under way at once; a
    leader waiting for one to end gathers every call queued meanwhile.

    Calls are parsed one at a time (`parse`): parsing is all Python, so parsing several at once gains
    nothing under the GIL, and every extra thread wanting the GIL delays the writer's return from each
    Postgres round trip.
    """

    def __init__(self, sessions: Sessions):
        self._sessions = sessions
        self._lock = threading.Lock()
        self._queued: list[_Ticket] = []
        self._writing = False
        self._config: SubmitConfig | None = None  # what the last write read, for small writes (_write_at_once)
        self._kept = database.KeptConnection(sessions)  # small writes' autocommit connection (_write_at_once)
        self.parsing = threading.Lock()  # held while parsing (parse)
        self._writes = threading.BoundedSemaphore(WRITES)

    def parse(self, specs_json: list[str], **numbering) -> list[JobSpec]:
        """`parse`, one call at a time."""
        with self.parsing:
            return parse(specs_json, **numbering)

    def whole(self, key: str) -> Whole:
        """A submit to gather from its requests, parsed one call at a time."""
        return Whole(key, self.parse)

    def submit_whole(self, principal: Principal, whole: Whole) -> Submitted:
        """Write a gathered submit with its idempotency key: a key its user committed with before answers
        that submit's ids and writes nothing."""
        return self._submit(_Ticket(principal, whole.specs(), whole.key, whole.digest))

    def submit(self, principal: Principal, specs: list[JobSpec]) -> list[int]:
        return self._submit(_Ticket(principal, specs)).ids

    def submit_wholes(self, calls: list[tuple[Principal, Whole]]) -> list[Submitted | BaseException]:
        """Write several gathered submits from one thread (the event loop's submit streams, gathered by an
        asynchronous.Coalescer): one answer per call, in order, its Submitted or its own error."""
        tickets = [_Ticket(principal, whole.specs(), whole.key, whole.digest) for principal, whole in calls]
        self._submit_all(tickets)
        return [ticket.outcome() for ticket in tickets]

    def _submit(self, ticket: _Ticket) -> Submitted:
        self._submit_all([ticket])
        return ticket.submitted()

    def _submit_all(self, tickets: list[_Ticket]) -> None:
        """Queue the tickets together (they are written in one group) and return once each is answered. A
        submit with waiting jobs or arrays is written alone, by services.waiting."""
        for ticket in tickets:
            if any(spec.waits() for spec in ticket.specs):
                self._write_waiting(ticket)
        tickets = [t for t in tickets if not t.answered]
        if not tickets:
            return
        first = tickets[0]
        with self._lock:
            self._queued += tickets
            leads = not self._writing
            self._writing = True
        if not leads:
            first.turn.wait()  # answered, or handed the next write
        if not first.answered:
            with self._writes:
                with self._lock:
                    group, self._queued = self._queued, []
                handed = []

                def hand_on() -> None:
                    if not handed:
                        handed.append(True)
                        self._hand_on()
                try:
                    self._write(group, hand_on)
                finally:
                    hand_on()
                    if not self._queued:  # no write follows at once: the kept connection goes back to the pool
                        self._kept.release_if_idle()
        for ticket in tickets:
            ticket.turn.wait()

    def _hand_on(self) -> None:
        """The next write may begin: the first call still queued leads it, else no write is under way."""
        with self._lock:
            if self._queued:
                self._queued[0].turn.set()
            else:
                self._writing = False

    def _write(self, group: list[_Ticket], hand_on: Callable[[], None] | None = None) -> None:
        """Write a group in one transaction. hand_on(): the next write may begin; called once the rows are
        made when there are many (the next group then reads and validates while they go to Postgres by
        COPY), else by the caller after the commit, so that small calls keep gathering into one transaction."""
        try:
            if self._write_at_once(group):
                return
            with self._sessions.begin() as session:
                config = SubmitConfig.read(session, {s.queue for t in group for s in t.specs},
                                      self._config.seen if self._config else None)
                self._config = config
                rows: list[lifecycle.NewJob] = []
                for t in group:
                    try:
                        t.rows = config.rows(t.principal, t.specs)
                        rows += t.rows
                    except DispatcherError as exc:
                        t.answer(error=exc)
                if hand_on is not None and len(rows) >= HAND_ON_EARLY_FROM:
                    hand_on()  # a long insert: the next group validates meanwhile
                ids = iter(lifecycle.submit(session, rows, keys=_keys(t for t in group if not t.answered)))
            for t in group:
                if not t.answered:
                    t.answer(ids=[next(ids) for _ in t.rows])
        except Exception as exc:
            if len(group) == 1:
                if isinstance(exc, submit_keys.KeyUsed):
                    self._replay(group[0])
                else:
                    group[0].answer(error=exc)
                return
            for t in group:  # one call's trouble must not fail the others: each alone, with its own error
                if not t.answered:
                    self._write([t])
        finally:
            for t in group:
                if not t.answered:  # never leave a caller waiting
                    t.answer(error=RuntimeError("submit: not written"))

    def _write_at_once(self, group: list[_Ticket]) -> bool:
        """A write of a few jobs in one round trip, when it can: validated against what the last write read,
        and inserted by one statement in a transaction of its own, which first checks in its snapshot that
        what was read is unchanged: the version of the classes, queues and clusters (submit_config, kept
        by triggers) is still the one read (lifecycle.submit_if_unchanged). False, having answered no call
        and written nothing, when the group must go the long way (BEGIN, read, insert, COMMIT): it names a
        queue not read, a call is refused (its error is then the one a fresh read gives), or what was read
        has changed."""
        config = self._config
        if config is None or sum(len(t.specs) for t in group) >= lifecycle.COPY_FROM:
            return False
        queues = {s.queue for t in group for s in t.specs}
        if not queues <= config.found.keys():
            return False
        try:
            for t in group:
                t.rows = config.rows(t.principal, t.specs)
        except DispatcherError:
            return False
        config.forget_if_large()
        with self._kept as connection:
            ids = lifecycle.submit_if_unchanged(connection, [row for t in group for row in t.rows], config.seen[0],
                                                keys=_keys(group))
        if ids is None:
            return False
        it = iter(ids)
        for t in group:
            t.answer(ids=[next(it) for _ in t.rows])
        return True

    def _write_waiting(self, ticket: _Ticket) -> None:
        """Write a submit with waiting jobs or arrays in a transaction of its own, with its key."""
        count = sum(spec.array.count if spec.array is not None else 1 for spec in ticket.specs)
        try:
            if count > MAX_SUBMIT:
                raise InvalidRequest(f"submit: {count:,} jobs with the arrays' elements, at most {MAX_SUBMIT:,} "
                                     "in one submit; split the file")
            keys = [submit_keys.NewKey(ticket.principal.subject, ticket.key, ticket.digest, 0, count)] \
                if ticket.key else []
            with self._sessions.begin() as session:
                ids = waiting.submit(session, ticket.principal, ticket.specs, datetime.now(UTC), keys)
            ticket.answer(ids=ids)
        except submit_keys.KeyUsed:
            self._replay(ticket)
        except Exception as exc:
            ticket.answer(error=exc)

    def _replay(self, ticket: _Ticket) -> None:
        """Answer a submit whose key its user committed with before: that submit's ids, if its documents
        were the same."""
        with self._sessions() as session:
            found = submit_keys.find(session, ticket.principal.subject, ticket.key)
        if found is None:  # pruned in between: past its retention
            ticket.answer(error=Conflict(f"submit: idempotency key {ticket.key!r} is in use; retry"))
        elif found[0] != ticket.digest:
            ticket.answer(error=Conflict(f"submit: idempotency key {ticket.key!r} was used for other documents; "
                                         f"give each submit a key of its own"))
        else:
            ticket.answer(ids=found[1], replayed=True)


def _keys(tickets) -> list[submit_keys.NewKey]:
    """The idempotency keys of the tickets whose rows a write inserts, in that order."""
    keys, after = [], 0
    for t in tickets:
        if t.key:
            keys.append(submit_keys.NewKey(t.principal.subject, t.key, t.digest, after, len(t.rows)))
        after += len(t.rows)
    return keys


class _Ticket:
    def __init__(self, principal: Principal, specs: list[JobSpec], key: str = "", digest: str = ""):
        self.principal, self.specs = principal, specs
        self.key, self.digest = key, digest
        self.rows: list[lifecycle.NewJob] = []
        self.turn = threading.Event()
        self.answered = False
        self._ids: list[int] = []
        self._replayed = False
        self._error: BaseException | None = None

    def answer(self, *, ids: list[int] | None = None, error: BaseException | None = None,
               replayed: bool = False) -> None:
        self._ids, self._error, self._replayed, self.answered = ids or [], error, replayed, True
        self.turn.set()

    def submitted(self) -> Submitted:
        if self._error is not None:
            raise self._error
        return Submitted(self._ids, self._replayed)

    def outcome(self) -> Submitted | BaseException:
        return self._error if self._error is not None else Submitted(self._ids, self._replayed)
