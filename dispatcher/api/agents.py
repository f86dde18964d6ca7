"""The Agents service: one bidirectional stream per connected agent.

Inbound: hello (inventory, capacity), heartbeats (capacity), status reports (acked by sequence number
once committed), command acks. Outbound: the cluster's unacked outbox commands in id order, sent again
on every new connection until acked, then new ones as NOTIFY says they exist (from any replica).
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

import grpc

from dispatcher import wakes
from dispatcher.api import streams
from dispatcher.api.admission import AdmissionRate, AgentsFirst
from dispatcher.api.asynchronous import Coalescer, Rerun, blocking, from_thread
from dispatcher.api.auth import Authenticator
from dispatcher.api.errors import translated
from dispatcher.api.logs import LogRelay
from dispatcher.errors import (
    DispatcherError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
    Unauthenticated,
)
from dispatcher.metrics import DispatcherMetrics
from dispatcher.services import admin_sync, intake, submitting
from dispatcher.services import reporting as reports
from dispatcher.store import channels, database
from dispatcher.store import clusters as cluster_store
from dispatcher.store import outbox as outbox_store
from dispatcher.store.database import Sessions
from dispatcher.store.listening import Notifier
from dispatcher.store.tokens import Principal
from sluice._validate import unstorable_at
from sluice.v1 import agents_pb2, agents_pb2_grpc
from sluice.wire import AttemptReport

log = logging.getLogger(__name__)
_POLL, _END, _CHECK = object(), object(), object()  # on Connect's queue: read the outbox; link ended; check token
BATCH = 500  # outbox commands read per query
READ_BATCH = 100  # agent messages applied in one transaction at most (and the job rows it locks)
HELLOS_AT_ONCE = 100  # hellos reconciled in one transaction at most (and the clusters whose jobs it locks)


def capacity_document(capacity: agents_pb2.Capacity) -> dict:
    parts = (capacity.allocatable, capacity.free, capacity.largest_free_node, *capacity.node_free)
    if any("\x00" in name for part in parts for name in part.milli):  # Postgres cannot store it in jsonb
        raise InvalidRequest("capacity: a resource name contains a NUL character (\\u0000)")
    document = {"allocatable": dict(capacity.allocatable.milli), "free": dict(capacity.free.milli),
                "largestFreeNode": dict(capacity.largest_free_node.milli)}
    if capacity.node_free:  # older agents send none: placement then judges by the sums alone
        document["nodeFree"] = [dict(node.milli) for node in capacity.node_free]
        names = list(capacity.node_names)
        # Names that do not pair up one to one with the nodes are left out: no node's room is then known by name.
        if len(names) == len(capacity.node_free) == len(set(names)) and not any("\x00" in n for n in names):
            document["nodeNames"] = names
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
    that is not a valid Timestamp, which the store then takes as the report's arrival), a NUL in its
    reason or address shown as U+FFFD, and its nodes left out where they cannot be stored."""
    try:
        at = status.at.ToNanoseconds() / 1e9 if status.HasField("at") else 0.0
    except ValueError:  # nanos outside 0..999,999,999 or seconds past year 9999
        at = 0.0
    reason = status.reason
    if "\x00" in reason:  # a termination message may hold one; Postgres stores none
        reason = reason.replace("\x00", "\ufffd")
    address = status.address
    if "\x00" in address:
        address = address.replace("\x00", "\ufffd")
    # Nodes Postgres cannot store (a NUL in a name) or named twice are not said: what is stored stays.
    nodes = tuple((room.node, dict(room.held.milli)) for room in status.nodes)
    if len({node for node, _ in nodes}) < len(nodes) or any(
            "\x00" in node or any("\x00" in r for r in held) for node, held in nodes):
        nodes = ()
    return AttemptReport(status.job_id, status.attempt, status.state, reason, status.exit_code, at, address, nodes)


class AgentsService(agents_pb2_grpc.AgentsServicer):
    """The agent links, on the event loop (grpc.aio): a link holds no thread while it waits, and what many
    links write or read alike is done together (heartbeats and acks in one transaction, outbox reads in one
    query: asynchronous.Coalescer). What one link sends with status reports is applied in its own transaction,
    as before, its messages in order."""

    def __init__(self, sessions: Sessions, auth: Authenticator, notifier: Notifier, *, heartbeat_s: float,
                 metrics: DispatcherMetrics | None = None, admission: AdmissionRate | None = None,
                 agents_first: AgentsFirst | None = None, logs: LogRelay | None = None):
        self._metrics = metrics
        self._logs = logs or LogRelay()
        self._sessions = sessions
        self._one_statement = database.autocommit(sessions)
        self._auth = auth
        self._notifier = notifier
        self._heartbeat_s = heartbeat_s
        self.admission = admission or AdmissionRate("agent links", per_s=0, burst=1, max_wait_s=0)
        self._agents_first = agents_first or AgentsFirst(max_wait_s=0)
        self.links_open = 0  # changed on the loop only
        self._outbox = Coalescer(self._pending, name="outbox-reads")
        self._recorder = Coalescer(self._record, name="heartbeats-and-acks")
        self._hellos = Coalescer(self._reconcile, most=HELLOS_AT_ONCE, name="hellos")
        self._refusing = Rerun(self._refuse_impossible, name="refuse-impossible")
        self._loop: asyncio.AbstractEventLoop | None = None  # the links' (set by the first)
        self._outs: set[asyncio.Queue] = set()  # every open link's `out`, changed on the loop only
        auth.on_revocation(self._check_links)

    @translated
    async def Connect(self, request_iterator, context):
        with self._agents_first.connecting():  # watches opening meanwhile wait
            await self.admission.admit()
            revocations = self._auth.revocations
            who, cluster, acked, document, batches = await self._hello(request_iterator, context)
        log.info("agent connected", extra={"cluster": cluster})
        loop = self._loop = asyncio.get_running_loop()
        out: asyncio.Queue = asyncio.Queue()
        unsubscribe = self._notifier.subscribe(
            channels.OUTBOX_CHANNEL,
            lambda payload: loop.call_soon_threadsafe(out.put_nowait, _POLL) if payload in ("", cluster) else None)
        link = _Link(who, context, cluster)
        reader = asyncio.create_task(self._read(link, acked, request_iterator, out), name=f"agent-{cluster}")
        self.links_open += 1
        self._outs.add(out)
        if self._auth.revocations != revocations:  # one came during the hello, before _check_links knew this link
            out.put_nowait(_CHECK)
        self._logs.attach(cluster, out)
        try:
            yield agents_pb2.DispatcherMessage(welcome=agents_pb2.Welcome(
                cluster=cluster, heartbeat_seconds=max(1, int(self._heartbeat_s)),
                cluster_spec_json=json.dumps(document), reads_batches=True, takes_intake=True,
                takes_admin_resources=True))
            out.put_nowait(_POLL)
            sent = 0
            while True:
                # Everything ready goes out together: status acks, and the commands of one outbox read.
                try:
                    # A quiet link's token is checked when it expires, or when a revocation asks (_check_links).
                    async with asyncio.timeout(self._auth.check_within(who)):  # no task a wait, as wait_for makes
                        ready = [await out.get()]
                except TimeoutError:
                    ready = [_CHECK]
                while ready[-1] is not _END and not out.empty():
                    ready.append(out.get_nowait())
                failed = [item for item in ready if isinstance(item, Exception)]
                if failed:
                    raise failed[0]  # the reader's (a revoked token, the store gone): the stream ends with its status
                if _CHECK in ready and (refused := await self._refusal(link)) is not None:
                    raise refused
                messages = [item for item in ready if item is not _POLL and item is not _END and item is not _CHECK]
                if _POLL in ready:
                    commands = await self._outbox((cluster, sent))
                    if commands:
                        sent = commands[-1].id
                        messages += [agents_pb2.DispatcherMessage(command=_command(c)) for c in commands]
                    if len(commands) == BATCH:
                        out.put_nowait(_POLL)
                for run in streams.runs(messages) if batches else [[m] for m in messages]:
                    yield run[0] if len(run) == 1 else agents_pb2.DispatcherMessage(
                        batch=agents_pb2.DispatcherMessages(messages=run))
                if ready[-1] is _END:
                    return
        finally:
            self.links_open -= 1
            self._outs.discard(out)
            self._logs.detach(cluster, out)
            unsubscribe()
            reader.cancel()
            log.info("agent disconnected", extra={"cluster": cluster})

    def _check_links(self) -> None:
        """A token was revoked (on the listener's thread): every open link checks its own."""
        from_thread(self._loop, lambda: [out.put_nowait(_CHECK) for out in self._outs])

    async def _hello(self, request_iterator, context) -> tuple[Principal, str, int, dict, bool]:
        """Check and reconcile the hello; (who connected, cluster, highest acked command id, the Cluster
        object's document, whether the agent reads batches)."""
        who = await self._auth.require_on_loop(context, "agent", "admin")
        first = await anext(aiter(request_iterator), None)  # the pump goes on reading the same iterator
        if first is None:
            raise InvalidRequest("connect: the stream closed before its hello")
        if first.WhichOneof("kind") != "hello":
            raise InvalidRequest("connect: the first message must be a hello")
        hello = first.hello
        if who.role == "agent" and who.cluster != hello.cluster:
            raise PermissionDenied(f"this token belongs to the agent of cluster {who.cluster!r}, not {hello.cluster!r}")
        document, acked, first_report = await self._hellos(hello)
        if first_report:  # a scan of the queued jobs and every cluster: off the hello's path, one at a time
            self._refusing.ask()
        return who, hello.cluster, acked, document, hello.reads_batches

    def _reconcile(self, hellos: list[agents_pb2.Hello]) -> list[tuple[dict, int, bool] | DispatcherError]:
        """Record hellos' capacity and reconcile their inventories, many in one transaction (a restarted
        dispatcher's every agent says hello at once): for each, (the Cluster object's document, the highest
        command id the cluster acked, whether this is the cluster's first report ever), or the error it alone
        meets. Two hellos of one cluster are taken one after the other, as they came."""
        results: list = [None] * len(hellos)
        documents: dict[int, dict] = {}
        for i, hello in enumerate(hellos):
            try:
                documents[i] = capacity_document(hello.capacity)
            except DispatcherError as exc:
                results[i] = exc
        rounds: list[dict[str, int]] = []  # each a hello's index by its cluster: one a cluster in a round
        for i in documents:
            free = next((r for r in rounds if hellos[i].cluster not in r), None)
            if free is None:
                rounds.append(free := {})
            free[hellos[i].cluster] = i
        if not rounds:
            return results
        now = datetime.now(UTC)
        with self._sessions.begin() as session:
            for hello_of in rounds:
                rows = cluster_store.hello_rows(session, list(hello_of))
                for cluster in [c for c in hello_of if c not in rows]:
                    results[hello_of.pop(cluster)] = NotFound(f"cluster {cluster!r} not found")
                if not hello_of:
                    continue
                acked = outbox_store.acked_through(session, list(hello_of))
                # A new agent process reports from scratch: everything it acked before is in its report.
                cluster_store.record_heartbeats(
                    session, [(c, documents[i], max(acked[c], hellos[i].capacity.applied_through))
                              for c, i in hello_of.items()], now, first=True)
                orphans = reports.reconcile(
                    session, {c: [report_of(s) for s in hellos[i].inventory] for c, i in hello_of.items()},
                    self._metrics)
                for cluster, job_id, attempt in orphans:
                    outbox_store.add_cancel(session, cluster, job_id, attempt, "orphan: not a live attempt")
                for cluster, i in hello_of.items():
                    document, first_report = rows[cluster]
                    results[i] = (document, acked[cluster], first_report)
            channels.notify(session, channels.WAKE_CHANNEL)
        return results

    def _refuse_impossible(self) -> None:
        """A cluster's first report may make every cluster known: the jobs accepted while it was not, and
        that none can run, are refused, in a transaction of its own; a failure is logged."""
        try:
            with self._sessions.begin() as session:
                refused = submitting.refuse_impossible(session)
            if refused:
                log.info("jobs no cluster could ever run refused", extra={"jobs": len(refused)})
        except StoreUnavailable as exc:  # the next cluster's first report tries again
            log.warning("refusing jobs no cluster could ever run failed: %s", exc)
        except Exception:
            log.exception("refusing jobs no cluster could ever run failed")

    async def _refusal(self, link: _Link) -> DispatcherError | None:
        """None while the link's token holds (as the cache knows it); else the error that ends the link."""
        try:
            await self._auth.require_on_loop(link.context, "agent", "admin")
        except DispatcherError as exc:
            return exc
        return None

    def _pending(self, wants: list[tuple[str, int]]) -> list[list]:
        """The outbox commands after each (cluster, command id) of many links, in one query."""
        with self._one_statement() as session:
            return outbox_store.pending_many(session, wants, limit=BATCH)

    def _record(self, records: list[_Record]) -> list[None]:
        """The heartbeats and acks of many links in one transaction: one statement for the acks, one for the
        heartbeats (a cluster's newest), and one wake of the scheduler if any of them shows more room."""
        beats = {r.cluster: r for r in records if r.capacity is not None}
        acks = [(r.cluster, i) for r in records for i in r.acks]
        with self._one_statement() if not beats or not acks else self._sessions.begin() as session:
            if acks:
                outbox_store.ack_many(session, acks)
            if beats:
                cluster_store.record_heartbeats(session, [(r.cluster, r.capacity, r.applied_through)
                                                          for r in beats.values()], datetime.now(UTC))
                if any(r.more_room for r in beats.values()):
                    channels.notify(session, channels.WAKE_CHANNEL, wakes.ROOM)
        return [None] * len(records)

    async def _read(self, link: _Link, acked: int, request_iterator, out: asyncio.Queue) -> None:
        """Apply what the agent sends, in order, several messages at a time.

        A pump task moves messages off the stream as they arrive; this one takes everything waiting (up to
        READ_BATCH messages) and applies it: heartbeats and acks alone with those of every other link
        (_record), anything with status reports in one transaction of its own. Under load that turns the
        agent's acks, heartbeats and status reports (four or five small transactions per job) into one commit
        per batch. Replies (StatusAck) go out after the commit. A batch is applied only while the link's token
        holds: a revoked or expired one ends the link, and a batch with reports checks its token row in the
        round trip that locks their jobs (tokens.HELD_SQL).
        """
        inbox: asyncio.Queue = asyncio.Queue(maxsize=5 * READ_BATCH)  # bounded: a slow reader slows the agent
        pump = asyncio.create_task(_pump(request_iterator, inbox), name=f"agent-{link.cluster}-in")
        state = _LinkState(acked)
        try:
            ended = False
            while not ended:
                batch = [await inbox.get()]
                while len(batch) < READ_BATCH and batch[-1] is not _END and not inbox.empty():
                    batch.append(inbox.get_nowait())
                if batch[-1] is _END:
                    batch.pop()
                    ended = True
                if any(message.WhichOneof("kind") == "log_lines" for message in batch):  # answers, not records
                    for message in batch:
                        if message.WhichOneof("kind") == "log_lines":
                            self._logs.deliver(message.log_lines)
                    batch = [message for message in batch if message.WhichOneof("kind") != "log_lines"]
                if batch:
                    if (refused := await self._refusal(link)) is not None:
                        raise refused
                    # What the cluster's API server holds is answered apart: a submit is no status record.
                    for message in batch:
                        if message.WhichOneof("kind") == "intake":
                            out.put_nowait(await blocking(self._intake, link, message.intake))
                        elif message.WhichOneof("kind") == "admin_resources":
                            out.put_nowait(await blocking(self._admin_resources, link, message.admin_resources))
                    batch = [message for message in batch
                             if message.WhichOneof("kind") not in ("intake", "admin_resources")]
                if batch:
                    await self._apply(link, batch, state, out)
            if (error := await pump) is not None:
                raise error
        except (grpc.RpcError, grpc.aio.AioRpcError):
            pass  # the agent went away; it will reconnect and be reconciled
        except Exception as exc:  # the store unreachable too: unapplied reports stay unacked, sent again on redial
            out.put_nowait(exc)  # Connect raises it, ending the stream as any failed call ends
        finally:
            pump.cancel()
            out.put_nowait(_END)

    async def _apply(self, link: _Link, batch: list, state: _LinkState, out: asyncio.Queue) -> None:
        if all(message.WhichOneof("kind") in ("heartbeat", "ack") for message in batch):
            await self._recorder(self._heartbeats_and_acks(link.cluster, batch, state))
            return
        seq = await blocking(self._apply_reports, link, batch, state)
        if seq:  # cumulative: one ack covers every report of the batch
            out.put_nowait(agents_pb2.DispatcherMessage(status_ack=agents_pb2.StatusAck(seq=seq)))

    @staticmethod
    def _heartbeats_and_acks(cluster: str, batch: list, state: _LinkState) -> _Record:
        """What a batch of heartbeats and acks records (the newest heartbeat), with the link's state moved on."""
        record = _Record(cluster)
        for message in batch:
            if message.WhichOneof("kind") == "ack":
                record.acks.extend(message.ack.command_ids)
                state.acked = max([state.acked, *message.ack.command_ids])
            else:  # the acks before a heartbeat were applied before its snapshot: they raise its watermark
                capacity = message.heartbeat.capacity
                record.capacity = capacity_document(capacity)
                record.applied_through = max(state.acked, capacity.applied_through)
        if record.capacity is not None:
            record.more_room = more_room(state.capacity, record.capacity)
            state.capacity = record.capacity
        return record

    def _intake(self, link: _Link, message: agents_pb2.Intake) -> agents_pb2.DispatcherMessage:
        """Submit, cancel and answer the Jobs of the cluster's API server an intake message names."""
        if len(message.jobs) > intake.MAX_JOBS:
            raise InvalidRequest(f"intake: {len(message.jobs)} Jobs in one message, at most {intake.MAX_JOBS}")
        documents = [_intake_document(job) for job in message.jobs]
        mentions = [intake.Mention(job.uid, job.namespace, job.name, doc, job.deleting)
                    for job, doc in zip(message.jobs, documents) if isinstance(doc, dict)]
        with self._sessions.begin() as session:
            answers = iter(intake.receive(session, link.cluster, mentions))
        return agents_pb2.DispatcherMessage(intake_answers=agents_pb2.IntakeAnswers(answers=[
            _intake_answer(next(answers)) if isinstance(doc, dict) else agents_pb2.IntakeAnswer(uid=job.uid, error=doc)
            for job, doc in zip(message.jobs, documents)]))

    def _admin_resources(self, link: _Link, message: agents_pb2.AdminResources) -> agents_pb2.DispatcherMessage:
        """Apply the management cluster's sluice.io resources and say how each went."""
        if len(message.resources) > admin_sync.MAX_RESOURCES:
            raise InvalidRequest(f"admin resources: {len(message.resources)} in one message, "
                                 f"at most {admin_sync.MAX_RESOURCES}")
        resources = []
        for r in message.resources:
            document = _resource_document(r)
            resources.append(admin_sync.Resource(r.kind, r.name, document, r.deleting) if isinstance(document, dict)
                             else admin_sync.Resource(r.kind, r.name, {}, r.deleting, unreadable=document))
        with self._sessions.begin() as session:
            outcomes = admin_sync.sync(session, link.cluster, resources)
        return agents_pb2.DispatcherMessage(admin_outcomes=agents_pb2.AdminOutcomes(
            outcomes=[_admin_outcome(o) for o in outcomes]))

    def _apply_reports(self, link: _Link, batch: list, state: _LinkState) -> int:
        """Apply a batch with status reports in one transaction; the highest report seq it applied."""
        try:
            return self._apply_in_one_transaction(link, batch, state)
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
            return max(self._apply_in_one_transaction(link, [message], state) for message in batch)

    def _apply_in_one_transaction(self, link: _Link, batch: list, state: _LinkState) -> int:
        cluster = link.cluster
        acked, ids, seq, statuses = state.acked, [], 0, []
        heartbeat: tuple[dict, int] | None = None
        with self._sessions.begin() as session:
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
                    channels.notify(session, channels.WAKE_CHANNEL, wakes.ROOM)
        state.acked = acked
        if heartbeat is not None:
            state.capacity = heartbeat[0]
        return seq


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


@dataclass
class _Record:
    """What a link's batch of heartbeats and acks writes (AgentsService._record)."""
    cluster: str
    acks: list[int] = field(default_factory=list)
    capacity: dict | None = None  # the newest heartbeat's
    applied_through: int = 0
    more_room: bool = False


async def _pump(request_iterator, inbox: asyncio.Queue) -> Exception | None:
    """Move the agent's messages off the stream as they arrive, those of a batch one by one; _END when it
    ends. Returns why it ended, when it did not end cleanly (the reader raises it)."""
    error = None
    try:
        async for message in request_iterator:
            for one in message.batch.messages if message.WhichOneof("kind") == "batch" else (message,):
                await inbox.put(one)
    except Exception as exc:  # the agent went away
        error = exc
    await inbox.put(_END)
    return error


def _intake_document(job: agents_pb2.IntakeJob) -> dict | str:
    """An intake Job's object, or why it cannot be read (the Job is answered with that)."""
    if not job.uid:
        return "the Job has no metadata.uid"
    if (bad := unstorable_at({"uid": job.uid, "namespace": job.namespace, "name": job.name})) is not None:
        return f"the Job's metadata.{bad[0]} {bad[1]}"  # Postgres could not store it
    try:
        return submitting.decode(job.document_json)[0]
    except submitting.Undecodable as exc:
        return f"the Job: {exc}"


def _resource_document(resource: agents_pb2.AdminResource) -> dict | str:
    """A custom resource's object, or why it cannot be read (the resource is answered with that)."""
    if (bad := unstorable_at({"kind": resource.kind, "name": resource.name})) is not None:
        return f"the resource's {bad[0]} {bad[1]}"  # Postgres could not store it
    try:
        document = json.loads(resource.document_json)
    except (ValueError, RecursionError) as exc:
        return f"the resource is not JSON: {exc}"
    if not isinstance(document, dict):
        return "the resource is not a JSON object"
    if (bad := unstorable_at(document)) is not None:  # Postgres could not store it
        return f"the resource: {bad[0] or 'document'}: {bad[1]}"
    return document


def _admin_outcome(outcome: admin_sync.Outcome) -> agents_pb2.AdminOutcome:
    return agents_pb2.AdminOutcome(kind=outcome.kind, name=outcome.name, accepted=outcome.accepted,
                                   message=outcome.message, deleted=outcome.deleted, guaranteed=outcome.guaranteed,
                                   max=outcome.max, used=outcome.used)


def _intake_answer(answer: intake.Answer) -> agents_pb2.IntakeAnswer:
    return agents_pb2.IntakeAnswer(uid=answer.uid, job_id=answer.job_id, state=answer.state, reason=answer.reason,
                                   cluster=answer.cluster, attempt=answer.attempt, error=answer.error)


def _command(row) -> agents_pb2.Command:
    if row.kind == "dispatch":
        return agents_pb2.Command(id=row.id, dispatch=agents_pb2.DispatchAttempt(
            job_id=row.job_id, attempt=row.attempt, spec_json=row.spec_json, avoid_nodes=row.avoid_nodes))
    return agents_pb2.Command(id=row.id, cancel=agents_pb2.CancelAttempt(
        job_id=row.job_id, attempt=row.attempt, reason=row.reason))
