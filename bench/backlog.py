"""A deep backlog, loaded fast: queued jobs written by binary COPY straight into the real schema.

Not through the API (a million submits would take the benchmark's whole budget): the rows are what
`Submit` stores for the same documents (dispatcher/submitting.py: the canonical document with its
class filled in, total requests, largest pod, placement, labels, a `submitted` event each), built once
per (queue, shape, class, priority) by the project's own parser and repeated. Job ids are given
explicitly (the identity column is BY DEFAULT) and the sequence is moved past them afterwards.

The admin objects go in through `administering.apply` and the clusters' capacity through
`store.clusters.record_capacity`, the function an agent's hello and heartbeats end in.
"""
from __future__ import annotations

import json
import struct
import time
from datetime import UTC, datetime

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from bench import workload
from dispatcher.services import administering
from dispatcher.store import clusters as cluster_store
from dispatcher.store import database
from dispatcher.store.copy_codec import COPY_HEADER, COPY_TRAILER
from dispatcher.store.lifecycle import SUBMITTED

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
JOB_COLUMNS = ("id", "queue", "service_class", "class_priority", "priority", "state", "reason", "attempt",
               "max_retries", "spec", "requests", "largest_pod", "placement", "labels", "submitted_by", "created_at")
EVENT_COLUMNS = ("job_id", "attempt", "from_state", "to_state", "reason", "at")
CHUNK = 50_000  # rows per COPY (and per transaction)
SUBMITTER = "bench"


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def _int4(value: int) -> bytes:
    return struct.pack(">ii", 4, value)


def _jsonb(value: dict) -> bytes:
    data = b"\x01" + json.dumps(value, separators=(",", ":")).encode()  # jsonb binary: version 1, then text
    return struct.pack(">i", len(data)) + data


def _micros(at: datetime) -> int:
    delta = at - PG_EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


class Rows:
    """Encodes job rows and their submit events in COPY's binary format, caching what repeats."""

    def __init__(self, queues: int, classes=workload.CLASSES):
        self.queues = workload.queue_names(queues)
        self.priority_of = {c.name: c.priority for c in classes}
        self._middle: dict[tuple, bytes] = {}
        self._event_middle = (_int4(0) + _text("") + _text("QUEUED") + _text(SUBMITTED))
        self.base = _micros(datetime.now(UTC)) - 3_600_000_000  # submitted over the last hour or so

    def key(self, i: int) -> tuple[str, workload.Shape, str, int]:
        """Job number i: queues in turn, shapes in turn per round, class and priority from a cheap hash."""
        h = (i * 2654435761) & 0xFFFFFFFF
        return (self.queues[i % len(self.queues)], workload.SHAPES[(i // len(self.queues)) % len(workload.SHAPES)],
                workload.CLASS_MIX[(h >> 8) % len(workload.CLASS_MIX)], h % 10)

    def _encoded(self, key: tuple) -> bytes:
        middle = self._middle.get(key)
        if middle is None:
            queue, shape, service_class, priority = key
            spec = workload.parsed(workload.job_document(queue, shape, service_class, priority))
            doc = spec.to_document()
            doc["spec"]["serviceClass"] = service_class  # as submitting.submit stores it
            middle = b"".join((
                _text(queue), _text(service_class), _int4(self.priority_of[service_class]), _int4(priority),
                _text("QUEUED"), _text(SUBMITTED), _int4(0), _int4(spec.max_retries), _jsonb(doc),
                _jsonb(spec.total_requests()), _jsonb(spec.largest_pod()), _jsonb(doc["spec"].get("placement", {})),
                _jsonb(dict(spec.labels)), _text(SUBMITTER)))
            self._middle[key] = middle
        return middle

    def jobs(self, start: int, stop: int) -> bytes:
        """Jobs number start..stop-1 (id = number + 1), created 1 ms apart."""
        pack_id, pack_at = struct.Struct(">hiq").pack, struct.Struct(">iq").pack
        n = len(JOB_COLUMNS)
        return b"".join(pack_id(n, 8, i + 1) + self._encoded(self.key(i)) + pack_at(8, self.base + i * 1000)
                        for i in range(start, stop))

    def events(self, start: int, stop: int) -> bytes:
        pack_id, pack_at = struct.Struct(">hiq").pack, struct.Struct(">iq").pack
        n, middle = len(EVENT_COLUMNS), self._event_middle
        return b"".join(pack_id(n, 8, i + 1) + middle + pack_at(8, self.base + i * 1000) for i in range(start, stop))


def load(libpq_url: str, rows: Rows, start: int, stop: int, *, progress=None) -> dict[str, float]:
    """COPY jobs start..stop-1 and their submit events, the usual bulk-load way: the jobs table's secondary
    indexes are dropped first and rebuilt after from their own definitions (pg_indexes), and the load's
    session skips foreign-key triggers (every row is valid by construction). Then vacuum and analyze, as
    autovacuum would after a bulk insert, and move the id sequences past the new ids.
    Returns seconds spent: {"encode", "copy", "index", "vacuum"}."""
    took = {"encode": 0.0, "copy": 0.0, "index": 0.0, "vacuum": 0.0}
    with psycopg.connect(libpq_url) as conn:
        conn.execute("SET session_replication_role = replica")  # no FK triggers for this session's writes
        conn.execute("SET maintenance_work_mem = '512MB'")
        indexes = conn.execute(
            """SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'jobs'
               AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = 'jobs'::regclass)""").fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        conn.commit()
        for lo in range(start, stop, CHUNK):
            hi = min(stop, lo + CHUNK)
            began = time.perf_counter()
            jobs, events = rows.jobs(lo, hi), rows.events(lo, hi)
            took["encode"] += time.perf_counter() - began
            began = time.perf_counter()
            with conn.cursor() as cur:
                with cur.copy(f"COPY jobs ({', '.join(JOB_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.write(COPY_HEADER)
                    copy.write(jobs)
                    copy.write(COPY_TRAILER)
                with cur.copy(f"COPY job_events ({', '.join(EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.write(COPY_HEADER)
                    copy.write(events)
                    copy.write(COPY_TRAILER)
            conn.commit()
            took["copy"] += time.perf_counter() - began
            if progress:
                progress(hi)
        began = time.perf_counter()
        for _, definition in indexes:
            conn.execute(definition)
        conn.execute("SELECT setval(pg_get_serial_sequence('jobs', 'id'), (SELECT max(id) FROM jobs))")
        conn.execute("SELECT setval(pg_get_serial_sequence('job_events', 'id'), (SELECT max(id) FROM job_events))")
        conn.commit()
        took["index"] = time.perf_counter() - began
    began = time.perf_counter()
    with psycopg.connect(libpq_url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) jobs")
        conn.execute("VACUUM (ANALYZE) job_events")
    took["vacuum"] = time.perf_counter() - began
    return took


def register(url: str, *, queues: int, clusters: int, nodes: int) -> None:
    """Classes, the queue tree and the clusters, as `sluice admin apply` stores them."""
    db = database.connect(database.DatabaseSettings(url=url, pool_size=1, pool_overflow=0))
    try:
        with sessionmaker(db.engine).begin() as session:
            administering.apply(session, "bench", [*workload.CLASSES, *workload.queue_tree(queues),
                                                   *workload.cluster_objects(clusters, nodes)])
    finally:
        db.close()


def heartbeat(session, names: list[str], nodes: int, used: dict[str, dict[str, int]], applied: dict[str, int],
              now: datetime, *, full: bool = False) -> None:
    """Every cluster's capacity report, as its sim agent would send it now (record_capacity: the agent
    link's own write). full: every node taken (nothing fits)."""
    whole = workload.capacity(nodes)["allocatable"]
    for name in names:
        report = workload.capacity(nodes, whole if full else used.get(name))
        cluster_store.record_capacity(session, name, report, applied.get(name, 0), now)


class Agents:
    """Stands in for the 100 agents between cycles: what each cluster was sent since the last round is
    applied at once (its pods take room) and reported back with its applied_through, as a sim agent's
    heartbeat would say it. This is agent-side work: it runs outside the timed cycles."""

    def __init__(self, names: list[str], nodes: int):
        self.names = names
        self.nodes = nodes
        self.used: dict[str, dict[str, int]] = {}
        self.applied: dict[str, int] = {}
        self.seen = 0  # highest outbox id applied

    def report(self, session, now: datetime, *, full: bool = False) -> None:
        rows = session.execute(text(
            """SELECT o.cluster, max(o.id), sum((j.requests->>'cpu')::bigint), sum((j.requests->>'memory')::bigint)
               FROM outbox o JOIN jobs j ON j.id = o.job_id
               WHERE o.id > :seen AND o.kind = 'dispatch' GROUP BY o.cluster"""), {"seen": self.seen}).all()
        for cluster, top, cpu, memory in rows:
            used = self.used.setdefault(cluster, {"cpu": 0, "memory": 0})
            used["cpu"] += int(cpu)
            used["memory"] += int(memory)
            self.applied[cluster] = max(self.applied.get(cluster, 0), int(top))
            self.seen = max(self.seen, int(top))
        heartbeat(session, self.names, self.nodes, self.used, self.applied, now, full=full)
