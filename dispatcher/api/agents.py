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
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc

from dispatcher.api import streams
from dispatcher.api.auth import RECHECK_S, Authenticator
from dispatcher.api.errors import translated
from dispatcher.errors import DispatcherError, InvalidRequest, PermissionDenied, StoreUnavailable, Unauthenticated
from dispatcher.metrics import DispatcherMetrics
from dispatcher.services import reporting as reports
from dispatcher.services import submitting
from dispatcher.store import channels, database
from dispatcher.store import clusters as cluster_store
from dispatcher.store import outbox as outbox_store
from dispatcher.store.database import Sessions
from dispatcher.store.listening import Notifier
from dispatcher.store.tokens import Principal
from sluice.v1 import agents_pb2, agents_pb2_grpc
from sluice.wire import AttemptReport

log = logging.getLogger(__name__)
_POLL, _END = object(), object()
BATCH = 500  # outbox commands read per query
READ_BATCH = 100  # agent messages applied in one transaction at most (and the job rows it locks)


def capacity_document(capacity: agents_pb2.Capacity) -> dict:
    parts = (capacity.allocatable, capacity.free, capacity.largest_free_node, *capacity.node_free)
    if any("\x00" in name for part in parts for name in part.milli):  # Postgres cannot store it in jsonb
        raise InvalidRequest("capacity: a resource name contains a NUL character (\\u0000)")
    document = {"allocatable": dict(capacity.allocatable.milli), "free": dict(capacity.free.milli),
                "largestFreeNode": dict(capacity.largest_free_node.milli)}
    if capacity.node_free:  # older agents send none: placement then judges by the sums alone
        document["nodeFree"] = [dict(node.milli) for node in capacity.node_free]
    return document


def more_room(before: dict | None, after: dict) -> bool:
    """Whether a capacity report shows room the one before did not: more of some resource free, on the
    largest free node, or allocatable. Less room (pods created, nodes gone) starts nothing."""
    if before is None:
        return True
    return any(amount > before.get(part, {}).get(resource, 0)
               for part in ("free", "largestFreeNode", "allocatable")
               for resource, amount in after.get(part, {}).items())


def report_of(status: agents_pb2.AttemptStatus) -> AttemptReport:
    """The report as the store applies it, with the agent's time (0 when unstamped: older agents, or a time
    that is not a valid Timestamp, which the store then takes as the report's arrival), and a NUL in its
    reason shown as U+FFFD."""
    try:
        at = status.at.ToNanoseconds() / 1e9 if status.HasField("at") else 0.0
    except ValueError:  # nanos outside 0..999,999,999 or seconds past year 9999
        at = 0.0
    reason = status.reason
    if "\x00" in reason:  # a termination message may hold one; Postgres stores none
        reason = reason.replace("\x00", "\ufffd")
    return AttemptReport(status.job_id, status.attempt, status.state, reason, status.exit_code, at)


class AgentsService(agents_pb2_grpc.AgentsServicer):
    def __init__(self, sessions: Sessions, auth: Authenticator, notifier: Notifier, *, heartbeat_s: float,
                 metrics: DispatcherMetrics | None = None):
        self._metrics = metrics
        self._sessions = sessions
        self._one_statement = database.autocommit(sessions)
        self._auth = auth
        self._notifier = notifier
        self._heartbeat_s = heartbeat_s

    @translated
    def Connect(self, request_iterator, context):
        who, cluster, acked, document, batches = self._hello(request_iterator, context)
        log.info("agent connected", extra={"cluster": cluster})
        out: queue.Queue = queue.Queue()
        unsubscribe = self._notifier.subscribe(
            channels.OUTBOX_CHANNEL, lambda payload: out.put(_POLL) if payload in ("", cluster) else None)
        context.add_callback(lambda: out.put(_END))
        link = _Link(who, context, cluster)
        reader = threading.Thread(target=self._read, args=(link, acked, request_iterator, out),
                                  name=f"agent-{cluster}", daemon=True)
        reader.start()
        yield agents_pb2.DispatcherMessage(welcome=agents_pb2.Welcome(
            cluster=cluster, heartbeat_seconds=max(1, int(self._heartbeat_s)),
            cluster_spec_json=json.dumps(document), reads_batches=True))
        out.put(_POLL)
        sent = 0
        try:
            while True:
                # Everything ready goes out together: status acks, and the commands of one outbox read.
                try:
                    ready = [out.get(timeout=RECHECK_S)]
                except queue.Empty:  # a quiet link: its token is checked all the same
                    ready = None
                if ready is None:
                    if (refused := self._still_allowed(link)) is not None:
                        raise refused
                    continue
                while ready[-1] is not _END:
                    try:
                        ready.append(out.get_nowait())
                    except queue.Empty:
                        break
                failed = [item for item in ready if isinstance(item, Exception)]
                if failed:
                    raise failed[0]  # the reader's (a revoked token, the store gone): the stream ends with its status
                messages = [item for item in ready if item is not _POLL and item is not _END]
                if _POLL in ready:
                    with self._one_statement() as session:
                        commands = outbox_store.pending(session, cluster, after_id=sent, limit=BATCH)
                    if commands:
                        sent = commands[-1].id
                        messages += [agents_pb2.DispatcherMessage(command=_command(c)) for c in commands]
                    if len(commands) == BATCH:
                        out.put(_POLL)
                for run in streams.runs(messages) if batches else [[m] for m in messages]:
                    yield run[0] if len(run) == 1 else agents_pb2.DispatcherMessage(
                        batch=agents_pb2.DispatcherMessages(messages=run))
                if ready[-1] is _END:
                    return
        finally:
            unsubscribe()
            log.info("agent disconnected", extra={"cluster": cluster})

    def _hello(self, request_iterator, context) -> tuple[Principal, str, int, dict, bool]:
        """Check and reconcile the hello; (who connected, cluster, highest acked command id, the Cluster
        object's document, whether the agent reads batches)."""
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
        now = datetime.now(UTC)
        with self._sessions.begin() as session:
            row = cluster_store.get_cluster(session, hello.cluster)
            document, first_report = dict(row.spec or {}), row.capacity is None
            acked = outbox_store.acked_through(session, hello.cluster)
            # A new agent process reports from scratch: everything it acked before is in its report.
            cluster_store.record_capacity(session, hello.cluster, capacity_document(hello.capacity),
                                          max(acked, hello.capacity.applied_through), now, first=True)
            orphans = reports.reconcile(session, hello.cluster, [report_of(s) for s in hello.inventory],
                                        self._metrics)
            for job_id, attempt in orphans:
                outbox_store.add_cancel(session, hello.cluster, job_id, attempt, "orphan: not a live attempt")
            channels.notify(session, channels.WAKE_CHANNEL)
        if first_report:  # a scan of the queued jobs: off the hello's path
            threading.Thread(target=self._refuse_impossible, args=(hello.cluster,), name="refuse-impossible",
                             daemon=True).start()
        return who, hello.cluster, acked, document, hello.reads_batches

    def _refuse_impossible(self, cluster: str) -> None:
        """A cluster's first report may make every cluster known: the jobs accepted while it was not, and
        that none can run, are refused, in a transaction of its own; a failure is logged."""
        try:
            with self._sessions.begin() as session:
                refused = submitting.refuse_impossible(session)
            if refused:
                log.info("jobs no cluster could ever run refused", extra={"cluster": cluster, "jobs": len(refused)})
        except Exception:
            log.exception("refusing jobs no cluster could ever run failed", extra={"cluster": cluster})

    def _still_allowed(self, link: _Link) -> DispatcherError | None:
        """None while the link's token holds (as the cache knows it); else the error that ends the link."""
        try:
            self._auth.require(link.context, "agent", "admin")
        except DispatcherError as exc:
            return exc
        return None

    def _read(self, link: _Link, acked: int, request_iterator, out: queue.Queue) -> None:
        """Apply what the agent sends, in order, several messages per transaction.

        A pump thread moves messages off the stream as they arrive; this thread takes everything waiting
        (up to READ_BATCH messages) and applies it in one transaction. Under load that turns the agent's
        acks, heartbeats and status reports (four or five small transactions per job) into one commit per
        batch; when idle a batch is one message, as before. Replies (StatusAck) go out after the commit.
        A batch is applied only while the link's token holds: a revoked or expired one ends the link, and a
        batch with reports checks its token row in the round trip that locks their jobs (tokens.HELD_SQL).
        """
        cluster = link.cluster
        inbox = _Inbox()
        pump = threading.Thread(target=_pump, args=(request_iterator, inbox), name=f"agent-{cluster}-in", daemon=True)
        pump.start()
        state = _LinkState(acked)
        try:
            ended = False
            while not ended:
                batch = [inbox.get()]
                while len(batch) < READ_BATCH and batch[-1] is not _END:
                    try:
                        batch.append(inbox.get_nowait())
                    except queue.Empty:
                        break
                if batch[-1] is _END:
                    batch.pop()
                    ended = True
                if batch:
                    if (refused := self._still_allowed(link)) is not None:
                        raise refused
                    self._apply(link, batch, state, out)
            if inbox.error is not None:
                raise inbox.error
        except grpc.RpcError:
            pass  # the agent went away; it will reconnect and be reconciled
        except Exception as exc:  # the store unreachable too: unapplied reports stay unacked, sent again on redial
            out.put(exc)  # Connect raises it, ending the stream as any failed call ends
        finally:
            inbox.closed.set()
            out.put(_END)

    def _apply(self, link: _Link, batch: list, state: _LinkState, out: queue.Queue) -> None:
        try:
            self._apply_in_one_transaction(link, batch, state, out)
        except (Unauthenticated, StoreUnavailable):
            raise  # nothing of the batch may be applied (a revoked token), or one by one would fail the same way
        except Exception:
            if len(batch) == 1:
                raise
            # Nothing of the batch committed. Its reports may have deadlocked with a writer that locks
            # several jobs (a cancel of many, a cycle's preemptions): Postgres aborted us. One message
            # per transaction, as an unbatched link would, locks one job at a time.
            log.warning("agent batch failed; applying its messages one by one", exc_info=True,
                        extra={"cluster": link.cluster, "messages": len(batch)})
            for message in batch:
                self._apply_in_one_transaction(link, [message], state, out)

    def _apply_in_one_transaction(self, link: _Link, batch: list, state: _LinkState, out: queue.Queue) -> None:
        cluster = link.cluster
        acked, ids, seq, statuses = state.acked, [], 0, []
        heartbeat: tuple[dict, int] | None = None
        # Acks alone (one per command, the commonest batch at light load) are one statement: autocommitted,
        # without a BEGIN and a COMMIT round trip around it.
        acks_only = all(message.WhichOneof("kind") == "ack" for message in batch)
        with self._one_statement() if acks_only else self._sessions.begin() as session:
            for message in batch:
                kind = message.WhichOneof("kind")
                if kind == "heartbeat":
                    # The acks before a heartbeat were applied before its snapshot: they raise its watermark.
                    # The acks after it (in this batch) must not.
                    capacity = message.heartbeat.capacity
                    heartbeat = (capacity_document(capacity), max(acked, capacity.applied_through))
                elif kind == "status":
                    statuses.append(report_of(message.status.status))
                    seq = max(seq, message.status.seq)
                elif kind == "ack":
                    ids.extend(message.ack.command_ids)
                    acked = max([acked, *message.ack.command_ids])
                else:
                    log.warning("unexpected agent message ignored", extra={"cluster": cluster, "kind": kind})
            if statuses:
                # A report sent after its token was revoked (on any replica) or expired is not applied.
                self._auth.confirm(link.who)
                reports.apply_many(session, cluster, statuses, self._metrics, held_by=link.who)
            if ids:
                outbox_store.ack(session, cluster, ids)
            if heartbeat is not None:
                cluster_store.record_capacity(session, cluster, heartbeat[0], heartbeat[1], datetime.now(UTC))
                if more_room(state.capacity, heartbeat[0]):
                    channels.notify(session, channels.WAKE_CHANNEL, channels.ROOM)
        state.acked = acked
        if heartbeat is not None:
            state.capacity = heartbeat[0]
        if seq:  # cumulative: one ack covers every report of the batch
            out.put(agents_pb2.DispatcherMessage(status_ack=agents_pb2.StatusAck(seq=seq)))


@dataclass(frozen=True)
class _Link:
    """One agent connection: who opened it, its call, and the cluster it speaks for."""
    who: Principal
    context: grpc.ServicerContext
    cluster: str


class _LinkState:
    """What one agent connection's reader remembers between batches."""

    def __init__(self, acked: int):
        self.acked = acked  # the highest command id this agent acked (floors its capacity watermark)
        self.capacity: dict | None = None  # the last capacity recorded (a change wakes the scheduler)


class _Inbox(queue.Queue):
    """The messages the pump took off the stream and the reader has not applied yet.

    Bounded, so a reader that falls behind still slows the agent down through gRPC flow control rather
    than piling its messages up here.
    """

    def __init__(self) -> None:
        super().__init__(maxsize=5 * READ_BATCH)
        self.error: Exception | None = None  # why the stream ended, when it did not end cleanly
        self.closed = threading.Event()  # the reader stopped: the pump stops too

    def offer(self, item) -> bool:
        """Put, waiting while full; False once the reader has stopped."""
        while not self.closed.is_set():
            try:
                self.put(item, timeout=0.5)
                return True
            except queue.Full:
                pass
        return False


def _pump(request_iterator, inbox: _Inbox) -> None:
    """Move the agent's messages off the stream as they arrive, those of a batch one by one; _END (and the
    error, if any) when it ends."""
    try:
        for message in request_iterator:
            for one in message.batch.messages if message.WhichOneof("kind") == "batch" else (message,):
                if not inbox.offer(one):
                    return
    except Exception as exc:  # grpc.RpcError when the agent goes away: the reader re-raises it
        inbox.error = exc
    inbox.offer(_END)


def _command(row) -> agents_pb2.Command:
    if row.kind == "dispatch":
        return agents_pb2.Command(id=row.id, dispatch=agents_pb2.DispatchAttempt(
            job_id=row.job_id, attempt=row.attempt, spec_json=row.spec_json))
    return agents_pb2.Command(id=row.id, cancel=agents_pb2.CancelAttempt(
        job_id=row.job_id, attempt=row.attempt, reason=row.reason))
