"""Accepting jobs: the server's authoritative validation, then one insert for the whole batch.

A batch is all-or-nothing: any invalid document rejects the call and nothing is created.

Concurrent calls share a transaction (group commit, `Submitter`): the first caller in writes every call
waiting at that moment in one transaction, validated against what that transaction reads, and each call
is answered after the commit with its own ids or its own error. Under load that turns N commits, N
reads of the classes, queues and clusters, and N pairs of notifications into one of each. A write hands
on to the next once its rows are made when they are many, so one group's validating overlaps another's
insert (two at most). A write of a few jobs goes in one round trip when it can (`_write_at_once`):
validated against what the last write read, in one statement that first checks it is unchanged.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import orjson
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.capacity import snapshot
from dispatcher.errors import DispatcherError, InvalidRequest, NotFound, PermissionDenied
from dispatcher.policy.placing import ClusterState, QueuedJob, impossible
from dispatcher.store import clusters as cluster_store
from dispatcher.store import copy_codec, lifecycle
from dispatcher.store.tokens import Principal
from sluice.spec import JobSpec, SpecError, job_from_document

MAX_BATCH = 10_000  # jobs per Submit call
MAX_SPEC_BYTES = 1 << 20  # one job document
WRITES = 2  # write transactions under way at once: one's rows go to Postgres while the next is validated
# Jobs in a write from which it hands on before its insert (see Submitter._write): the writes that go by
# COPY, which draw their ids before it, so the groups' ids still follow their order.
HAND_ON_EARLY_FROM = lifecycle.COPY_FROM
GATHER_S = 0.0003  # how long a write's leader waits for more calls (see Submitter)


# orjson decodes a document 3x faster than `json` and, for what both take, to the same values, except an
# integer past 64 bits (orjson makes it a float) and nesting `json` refuses (RecursionError): documents that
# may hold either go to `json` (19 digits in a row, or 400 brackets: all but never). orjson refuses NaN,
# Infinity, 1E400 and lone surrogates, which `json` takes: it decodes those documents too, and words
# every error.
_DIGITS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))  # bytes.translate: each digit to "0", else " "
_LONG_NUMBER = b"0" * 19
_FEW_BRACKETS = 400


def _decode(document: str) -> tuple[object, bool]:
    """(the decoded document, whether `json` decoded it); raises json.JSONDecodeError as `json` does."""
    try:
        data = document.encode()
    except UnicodeEncodeError:  # a lone surrogate: never from gRPC, which sends UTF-8
        data = None
    if (data is not None and data.count(b"{") + data.count(b"[") < _FEW_BRACKETS
            and _LONG_NUMBER not in data.translate(_DIGITS)):
        try:
            return orjson.loads(data), False
        except orjson.JSONDecodeError:
            pass
    return json.loads(document), True


class _ExactJSON(list):
    """The specs of a call with a document only `json` decoded: its rows' documents are encoded by `json`
    too (store.copy_codec.ExactJSON), so values orjson would write otherwise (NaN as null) reach Postgres as
    before."""


def parse(specs_json: list[str]) -> list[JobSpec]:
    if not specs_json:
        raise InvalidRequest("submit: no jobs given")
    if len(specs_json) > MAX_BATCH:
        raise InvalidRequest(f"submit: {len(specs_json)} jobs in one call, at most {MAX_BATCH}")
    out, exact = [], False
    for n, document in enumerate(specs_json, 1):
        if len(document) > MAX_SPEC_BYTES:
            raise InvalidRequest(f"job {n}: document is {len(document)} bytes, at most {MAX_SPEC_BYTES}")
        try:
            doc, by_json = _decode(document)
            exact = exact or by_json
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"job {n}: not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidRequest(f"job {n}: expected a JSON object")
        if "\\u0000" in document and (where := _nul_at(doc)) is not None:  # Postgres cannot store it in jsonb
            raise InvalidRequest(f"job {n}: {where or 'document'}: contains a NUL character (\\u0000)")
        try:
            out.append(job_from_document(doc, document=n if len(specs_json) > 1 else None, owned=True))
        except SpecError as exc:
            raise InvalidRequest(str(exc)) from exc
    return _ExactJSON(out) if exact else out


def _nul_at(value, path: str = "") -> str | None:
    """The path of the first key or string holding a NUL character, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        here = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        if isinstance(key, str) and "\x00" in key:
            return here.replace("\x00", "\\u0000")
        if (found := _nul_at(item, here)) is not None:
            return found
    return None


def submit(session: Session, principal: Principal, specs: list[JobSpec]) -> list[int]:
    """Validate and insert one call's jobs in the caller's transaction; returns their ids."""
    return lifecycle.submit(session, _Config.read(session, {s.queue for s in specs}).rows(principal, specs))


class Submitter:
    """Submit calls from many threads, written in shared transactions (group commit).

    A call queues its ticket; if no write is under way it writes every queued ticket itself, else it waits
    for the writer, which hands the next write to the first ticket still queued when it is done, or, for a
    write of many jobs, once its rows are made (validated and ready to insert): the next group then reads
    and validates while this one's rows go to Postgres. At most WRITES writes are under way at once; a
    leader waiting for one to end gathers every call queued meanwhile. (8 clients sending 1,000-job calls,
    back to back: 4,500-4,900 jobs/s handing on after the commit, 5,200-7,300 after the rows.)

    A leader finding fewer calls queued than the last write took waits GATHER_S first: those calls' clients
    are sending again, and one write of several costs Postgres and this process less per job than several
    writes. (Single-job calls, 8 clients: groups of 3.2 calls on average, 30 % of them one call alone;
    gathering, 1,809-1,840 -> 1,896-1,981 jobs/s, Postgres' CPU 148-152 -> 127-131 us a job.) Under light
    load the last write took one call, and a lone call does not wait.

    Calls are parsed one at a time (`parse`): parsing is all Python, so parsing several at once gains
    nothing under the GIL, and every extra thread wanting the GIL delays the writer's return from each
    Postgres round trip (8 clients sending 1,000-job calls: 3,500-4,100 jobs/s parsing at once,
    4,400-4,600 one at a time, the writes otherwise as they were).
    """

    def __init__(self, sessions: sessionmaker):
        self._sessions = sessions
        self._lock = threading.Lock()
        self._queued: list[_Ticket] = []
        self._writing = False
        self._config: _Config | None = None  # what the last write read, for small writes (_write_at_once)
        self._engine = sessions.kw["bind"]
        self._kept = _KeptConnection(self._engine)  # small writes' autocommit connection (_write_at_once)
        self._parsing = threading.Lock()
        self._writes = threading.BoundedSemaphore(WRITES)
        self._last_group = 0  # calls in the last group written
        self.gather_s = GATHER_S

    def parse(self, specs_json: list[str]) -> list[JobSpec]:
        """`parse`, one call at a time."""
        with self._parsing:
            return parse(specs_json)

    def submit(self, principal: Principal, specs: list[JobSpec]) -> list[int]:
        ticket = _Ticket(principal, specs)
        with self._lock:
            self._queued.append(ticket)
            leads = not self._writing
            self._writing = True
        if not leads:
            ticket.turn.wait()  # answered, or handed the next write
        if not ticket.answered:
            with self._writes:
                if len(self._queued) < self._last_group:  # more are on their way back (see the class)
                    time.sleep(self.gather_s)
                with self._lock:
                    group, self._queued = self._queued, []
                self._last_group = len(group)
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
        return ticket.result()

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
        COPY), else by the caller after the commit, so that small calls keep gathering into one transaction
        (single-job calls, 8 clients, every write handing on early and going by COPY: 224-278 jobs/s,
        against 326-414 with neither)."""
        try:
            if self._write_at_once(group):
                return
            with self._sessions.begin() as session:
                config = _Config.read(session, {s.queue for t in group for s in t.specs},
                                      self._config.seen if self._config else None)
                self._config = config
                rows = []
                for t in group:
                    try:
                        t.rows = config.rows(t.principal, t.specs)
                        rows += t.rows
                    except DispatcherError as exc:
                        t.answer(error=exc)
                if hand_on is not None and len(rows) >= HAND_ON_EARLY_FROM:
                    hand_on()  # a long insert: the next group validates meanwhile
                ids = iter(lifecycle.submit(session, rows))
            for t in group:
                if not t.answered:
                    t.answer(ids=[next(ids) for _ in t.rows])
        except Exception as exc:
            if len(group) == 1:
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
        by triggers) is still the one read (store.lifecycle.submit_if_unchanged). False, having answered no call and
        written nothing, when the group must go the long way (BEGIN, read, insert, COMMIT): it names a
        queue not read, a call is refused (its error is then the one a fresh read gives), or what was read
        has changed. (Single-job calls, 8 clients,
        back to back: 382-439 jobs/s the long way, 542-660 at once; the dispatcher's CPU 1.4-1.5 ->
        1.2-1.3 ms per job.)"""
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
            ids = lifecycle.submit_if_unchanged(connection, [row for t in group for row in t.rows], config.seen[0])
        if ids is None:
            return False
        it = iter(ids)
        for t in group:
            t.answer(ids=[next(it) for _ in t.rows])
        return True


class _KeptConnection:
    """An autocommit connection kept from one small write to the next while writes keep coming, so that a
    write does not pay a pool checkout (and its isolation-level changes) each time; a write gets its psycopg
    connection (store.lifecycle.submit_if_unchanged). It goes back to the pool once no call is queued after a write
    (`release_if_idle`), after any error, and if unused for KEEP_S; the next write then takes one afresh.
    One write at a time uses it (a lock; small writes hand on only after their statement anyway).
    (Single-job calls, 8 clients: when the pool pinged on every checkout, the checkout took 1.1 ms of a
    4.2 ms write, 360-418 -> 508-604 jobs/s; since the pool pings only connections idle 2 s, 666-780 -> 681-831.)"""

    KEEP_S = 1.0

    def __init__(self, engine):
        self._engine = engine
        self._lock = threading.Lock()
        self._connection = None
        self._used = 0.0

    def __enter__(self):
        self._lock.acquire()
        try:
            if self._connection is not None and time.monotonic() - self._used > self.KEEP_S:
                self._drop()
            if self._connection is None:
                self._connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            return self._connection.connection.driver_connection
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is not None:
                self._drop()
            self._used = time.monotonic()
        finally:
            self._lock.release()

    def release_if_idle(self) -> None:
        """Back to the pool, unless a write is using it."""
        if self._connection is not None and self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - a broken connection: the pool replaces it
                pass


class _Ticket:
    def __init__(self, principal: Principal, specs: list[JobSpec]):
        self.principal, self.specs = principal, specs
        self.rows: list[lifecycle.NewJob] = []
        self.turn = threading.Event()
        self.answered = False
        self._ids: list[int] = []
        self._error: BaseException | None = None

    def answer(self, *, ids: list[int] | None = None, error: BaseException | None = None) -> None:
        self._ids, self._error, self.answered = ids or [], error, True
        self.turn.set()

    def result(self) -> list[int]:
        if self._error is not None:
            raise self._error
        return self._ids


class _Config:
    """What validating a job reads: the service classes, the queues it names, every cluster's allocatable."""

    def __init__(self, classes: dict[str, int], queues: dict[str, dict], known: list[ClusterState] | None):
        self.classes = classes  # name -> priority
        self.queues = queues  # name -> the Queue object's spec
        self.known = known  # None while any cluster has never reported (then nothing is judged)
        self._shapes: dict[tuple, tuple[dict, dict, dict, str | None]] = {}  # see _shape
        self._labels: dict[tuple, dict[str, str]] = {}  # one object per distinct labels, shared by jobs
        self.seen: tuple[int | None, list | None] = (None, None)
        self.found: dict[str, dict] = {}  # name -> the Queue object as read, of the queues named

    def forget_if_large(self) -> None:
        """Drop the shapes and labels kept once there are many: a config kept from write to write
        (Submitter._write_at_once) would otherwise keep every one ever submitted."""
        if len(self._shapes) + len(self._labels) > 10_000:
            self._shapes, self._labels = {}, {}

    @classmethod
    def read(cls, session: Session, queues: set[str], seen: tuple[int | None, list | None] | None = None) -> "_Config":
        """One round trip. seen: (version, clusters) of an earlier read, reused while the version read in
        this transaction is unchanged (the clusters' documents are then neither built, sent nor parsed)."""
        classes, found, version, clusters = cluster_store.submit_config(session, queues, seen[0] if seen else None)
        if clusters is None:
            known = seen[1]
        else:
            known = []
            for name, tier, site, labels, spec, allocatable in clusters:
                if allocatable is None:  # never reported: nothing is judged
                    known = None
                    break
                known.append(ClusterState(name, tier, site, dict(labels), allocatable, dict(allocatable),
                                          **snapshot.terms(spec, allocatable)))
        config = cls(classes, {name: (spec or {}).get("spec", {}) for name, spec in found.items()}, known or None)
        config.seen, config.found = (version, known), found
        return config

    def rows(self, principal: Principal, specs: list[JobSpec]) -> list[lifecycle.NewJob]:
        """The rows to insert for one call's jobs; raises for the first that may not be submitted."""
        out = []
        admitted: dict[tuple[str | None, str | None], str] = {}  # (queue, class asked for) -> class, checked
        exact = isinstance(specs, _ExactJSON)
        for n, spec in enumerate(specs, 1):
            asked = (spec.queue, spec.service_class)
            class_name = admitted.get(asked)
            if class_name is None:
                class_name = admitted[asked] = self._admit(principal, spec, f"job {n}" if len(specs) > 1 else "job")
            requests, largest, placement, why = self._shape(spec)
            if why:
                raise InvalidRequest(f"{f'job {n}' if len(specs) > 1 else 'job'}: {why}")
            labels = self._labels.setdefault(tuple(spec.labels.items()), spec.labels)
            doc = spec.to_document(share_templates=True)  # only serialised, never changed below the top
            doc["spec"]["serviceClass"] = class_name
            doc["spec"]["placement"] = placement
            if exact:
                doc = copy_codec.ExactJSON(doc)
            out.append(lifecycle.NewJob(
                name=spec.name, queue=spec.queue, service_class=class_name, class_priority=self.classes[class_name],
                priority=spec.priority, max_retries=spec.max_retries, spec=doc, requests=requests,
                largest_pod=largest, placement=placement, labels=labels, submitted_by=principal.subject))
        return out

    def _admit(self, principal: Principal, spec: JobSpec, where: str) -> str:
        """The service class a job runs in, once its queue, the principal's membership and the class are
        checked; raises what stops it."""
        qspec = self.queues.get(spec.queue)
        if qspec is None:
            raise NotFound(f"{where}: spec.queue: queue {spec.queue!r} not found")
        members = qspec.get("members") or []
        if principal.role != "admin" and members and principal.subject not in members:
            raise PermissionDenied(f"{where}: {principal.subject} may not submit to queue {spec.queue!r}")
        listed = qspec.get("serviceClasses") or []
        accepted = listed or sorted(self.classes)
        class_name = spec.service_class or self._default_class(listed)
        if class_name not in self.classes:
            raise NotFound(f"{where}: spec.serviceClass: service class {class_name!r} not found")
        if class_name not in accepted:
            raise InvalidRequest(f"{where}: spec.serviceClass: queue {spec.queue!r} accepts only "
                                 f"{', '.join(accepted)}")
        return class_name

    def _shape(self, spec: JobSpec) -> tuple[dict, dict, dict, str | None]:
        """(requests, largest pod, placement document, why no cluster could ever run it), judged once per
        job shape and placement. Jobs of one shape share these objects, so each is encoded once per write.
        The shape is the pod sets' counts and per-pod requests as given (summing them for every job cost more
        than the rest of judging it)."""
        p = spec.placement
        key = (tuple((ps.count, *ps.requests.items()) for ps in spec.pod_sets),
               tuple(sorted(p.cluster_selector.items())), p.tiers, p.sites)
        shape = self._shapes.get(key)
        if shape is None:
            requests, largest = spec.total_requests(), spec.largest_pod()
            why = None
            if self.known is not None:
                job = QueuedJob(0, requests, largest, dict(p.cluster_selector), tuple(p.tiers), tuple(p.sites))
                why = impossible(job, self.known)
            placement = {"clusterSelector": dict(p.cluster_selector), "tiers": list(p.tiers), "sites": list(p.sites)}
            shape = self._shapes[key] = (requests, largest, placement, why)
        return shape

    def _default_class(self, listed: list[str]) -> str:
        """The queue's first listed class; else `standard`; else the lowest-priority class there is."""
        if listed:
            return listed[0]
        if "standard" in self.classes:
            return "standard"
        if not self.classes:
            raise InvalidRequest("job: spec.serviceClass: required, no service classes are defined")
        return min(self.classes, key=lambda name: (self.classes[name], name))
