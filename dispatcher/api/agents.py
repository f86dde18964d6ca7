"""The Agents service: one bidirectional stream per connected agent.

Inbound: hello (inventory, capacity), heartbeats (capacity), status reports (acked by sequence number
once committed), command acks. Outbound: the cluster's unacked outbox commands in id order, sent again
on every new connection until acked, then new ones as NOTIFY says they exist (from any replica).
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from datetime import datetime, timezone

import grpc
from sqlalchemy.orm import sessionmaker

from dispatcher import reports
from dispatcher.api.auth import Authenticator
from dispatcher.api.errors import status_for
from dispatcher.errors import DispatcherError, InvalidRequest, PermissionDenied
from dispatcher.metrics import DispatcherMetrics
from dispatcher.notifying import Notifier
from dispatcher.store import clusters as cluster_store
from dispatcher.store import jobs as job_store
from dispatcher.store import outbox as outbox_store
from sluice.v1 import agents_pb2, agents_pb2_grpc

log = logging.getLogger(__name__)
_POLL, _END = object(), object()
BATCH = 500


def capacity_document(capacity: agents_pb2.Capacity) -> dict:
    return {"allocatable": dict(capacity.allocatable.milli), "free": dict(capacity.free.milli),
            "largestFreeNode": dict(capacity.largest_free_node.milli)}


def report_of(status: agents_pb2.AttemptStatus) -> reports.Report:
    return reports.Report(status.job_id, status.attempt, status.state, status.reason, status.exit_code)


class AgentsService(agents_pb2_grpc.AgentsServicer):
    def __init__(self, sessions: sessionmaker, auth: Authenticator, notifier: Notifier, *, heartbeat_s: float,
                 metrics: DispatcherMetrics | None = None):
        self._metrics = metrics
        self._sessions = sessions
        self._auth = auth
        self._notifier = notifier
        self._heartbeat_s = heartbeat_s

    def Connect(self, request_iterator, context):
        try:
            cluster, acked, document = self._hello(request_iterator, context)
        except DispatcherError as exc:
            context.abort(status_for(exc), str(exc))
        log.info("agent connected", extra={"cluster": cluster})
        out: queue.Queue = queue.Queue()
        unsubscribe = self._notifier.subscribe(
            job_store.OUTBOX_CHANNEL, lambda payload: out.put(_POLL) if payload in ("", cluster) else None)
        context.add_callback(lambda: out.put(_END))
        reader = threading.Thread(target=self._read, args=(cluster, acked, request_iterator, out),
                                  name=f"agent-{cluster}", daemon=True)
        reader.start()
        yield agents_pb2.DispatcherMessage(welcome=agents_pb2.Welcome(
            cluster=cluster, heartbeat_seconds=max(1, int(self._heartbeat_s)),
            cluster_spec_json=json.dumps(document)))
        out.put(_POLL)
        sent = 0
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if item is not _POLL:
                    yield item
                    continue
                with self._sessions() as session:
                    commands = outbox_store.pending(session, cluster, after_id=sent, limit=BATCH)
                for command in commands:
                    sent = command.id
                    yield agents_pb2.DispatcherMessage(command=_command(command))
                if len(commands) == BATCH:
                    out.put(_POLL)
        finally:
            unsubscribe()
            log.info("agent disconnected", extra={"cluster": cluster})

    def _hello(self, request_iterator, context) -> tuple[str, int, dict]:
        """Check and reconcile the hello; (cluster, highest acked command id, the Cluster object's document)."""
        who = self._auth.require(context, "agent", "admin")
        try:
            first = next(request_iterator)
        except StopIteration as exc:
            raise InvalidRequest("connect: the stream closed before its hello") from exc
        if first.WhichOneof("kind") != "hello":
            raise InvalidRequest("connect: the first message must be a hello")
        hello = first.hello
        if who.role == "agent" and who.cluster != hello.cluster:
            raise PermissionDenied(f"this token belongs to the agent of cluster {who.cluster!r}, not {hello.cluster!r}")
        now = datetime.now(timezone.utc)
        with self._sessions.begin() as session:
            document = dict(cluster_store.get_cluster(session, hello.cluster).spec or {})
            acked = outbox_store.acked_through(session, hello.cluster)
            # A new agent process reports from scratch: everything it acked before is in its report.
            cluster_store.record_capacity(session, hello.cluster, capacity_document(hello.capacity),
                                          max(acked, hello.capacity.applied_through), now, first=True)
            orphans = reports.reconcile(session, hello.cluster, [report_of(s) for s in hello.inventory],
                                        self._metrics)
            for job_id, attempt in orphans:
                outbox_store.add_cancel(session, hello.cluster, job_id, attempt, "orphan: not a live attempt")
            job_store.notify(session, job_store.WAKE_CHANNEL)
        return hello.cluster, acked, document

    def _read(self, cluster: str, acked: int, request_iterator, out: queue.Queue) -> None:
        last_capacity: dict | None = None
        try:
            for message in request_iterator:
                kind = message.WhichOneof("kind")
                if kind == "heartbeat":
                    capacity = capacity_document(message.heartbeat.capacity)
                    with self._sessions.begin() as session:
                        cluster_store.record_capacity(session, cluster, capacity,
                                                      max(acked, message.heartbeat.capacity.applied_through),
                                                      datetime.now(timezone.utc))
                        if capacity != last_capacity:
                            job_store.notify(session, job_store.WAKE_CHANNEL)
                    last_capacity = capacity
                elif kind == "status":
                    with self._sessions.begin() as session:
                        reports.apply(session, cluster, report_of(message.status.status), self._metrics)
                    out.put(agents_pb2.DispatcherMessage(status_ack=agents_pb2.StatusAck(seq=message.status.seq)))
                elif kind == "ack":
                    ids = list(message.ack.command_ids)
                    with self._sessions.begin() as session:
                        outbox_store.ack(session, cluster, ids)
                    acked = max([acked, *ids])
                else:
                    log.warning("unexpected agent message ignored", extra={"cluster": cluster, "kind": kind})
        except grpc.RpcError:
            pass  # the agent went away; it will reconnect and be reconciled
        except Exception:
            log.exception("agent stream failed", extra={"cluster": cluster})
        finally:
            out.put(_END)


def _command(row) -> agents_pb2.Command:
    if row.kind == "dispatch":
        return agents_pb2.Command(id=row.id, dispatch=agents_pb2.DispatchAttempt(
            job_id=row.job_id, attempt=row.attempt, spec_json=json.dumps(row.payload.get("spec", {}))))
    return agents_pb2.Command(id=row.id, cancel=agents_pb2.CancelAttempt(
        job_id=row.job_id, attempt=row.attempt, reason=row.payload.get("reason", "")))
