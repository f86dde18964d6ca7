"""The agent's link to the dispatcher: one outbound gRPC stream, reopened with backoff.

On every connection the agent sends a hello with its inventory (from the backend, i.e. the cluster)
and capacity, then every status report not yet acked, in order. Commands are applied in id order and
acked after they took effect; their (job, attempt) makes a repeat harmless (creation is idempotent).

The dispatcher may be several replicas (docs/scaling.md): `AgentSettings.dispatcher` then lists them,
and each new dial goes to the next address after the one that failed or whose link was lost.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import queue
import random
import threading
import time

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agent.backends.base import (
    FINAL_STATES,
    AdminOutcome,
    AttemptStatus,
    Backend,
    CapacityReport,
    IntakeAnswer,
    LogsGone,
)
from agent.metrics import AgentMetrics
from sluice import transport
from sluice.transport import Tls
from sluice.v1 import agents_pb2, agents_pb2_grpc, jobs_pb2

log = logging.getLogger(__name__)
VERSION = "0.1.0"
_HEARTBEAT = object()
MAX_BATCH = 100  # messages sent as one at most (the dispatcher applies up to 100 in one transaction)
LOG_BYTES = 32 << 10  # log text in one PodLogLines at most: a batch of them stays far under gRPC's limit
LOG_LINE_BYTES = 16 << 10  # a longer log line is cut there
API_SERVER_INTERVAL_S = 1.0  # how often what the cluster's API server holds is looked at for what to send
MAX_INTAKE = 500  # Jobs in one intake message at most (the dispatcher's limit)


# gRPC's own address-list targets ("ipv4:10.0.0.1:7070,10.0.0.2:7070", "ipv6:..."): passed through whole.
_GRPC_LIST_SCHEMES = ("ipv4:", "ipv6:")


def reconnect_delay(backoff: float, uniform=random.uniform) -> float:
    """How long to wait before dialling again: between half the backoff and all of it, at random, so that
    agents that lost the dispatcher together (a restart) do not all dial it again in the same instant."""
    return backoff * uniform(0.5, 1.0)


def dispatcher_addresses(value: str) -> tuple[str, ...]:
    """`host:port` or `host:port,host:port,...` -> the gRPC targets to dial, in order.

    A list of our own rather than one gRPC target with pick_first over several addresses: that needs
    literal IPs (the ipv4:/ipv6: schemes), while replicas are usually DNS names (a StatefulSet's
    `dispatcher-0.dispatcher:7070`), each of which gRPC resolves and balances by itself; and a fresh
    pick_first channel always starts from the first address again, so after a replica dies every
    reconnect would first dial the dead one. Here the next dial goes to the next address.
    """
    text = value.strip()
    if text.startswith(_GRPC_LIST_SCHEMES):
        return (text,)
    # Nothing usable: dial the value as given, as one address (gRPC says what is wrong).
    return tuple(a.strip() for a in text.split(",") if a.strip()) or (value,)


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    cluster: str
    # host:port, or several replicas' host:port,host:port,...: tried in turn, moving to the next on a
    # failed dial or a lost link (any replica serves any agent).
    dispatcher: str
    token: str  # "": the agent authenticates with its client certificate (tls.cert, tls.key) alone
    heartbeat_s: float = 1.0  # capacity report interval
    backoff_initial_s: float = 0.2  # first reconnect delay, doubled up to backoff_max_s (each wait: a random
    # half to whole of it, reconnect_delay)
    backoff_max_s: float = 10.0
    # How the dispatcher is reached: TLS verified against tls.ca (or the system's roots), optionally with a
    # client certificate naming this cluster (mTLS, on the dispatcher's agent port); insecure: loopback only.
    tls: Tls = Tls()

    @property
    def addresses(self) -> tuple[str, ...]:
        return dispatcher_addresses(self.dispatcher)


_INT32 = (-(1 << 31), (1 << 31) - 1)
_LATEST_AT = 253402300799.0  # 9999-12-31T23:59:59Z, the last second a protobuf Timestamp holds


def _status_message(status: AttemptStatus) -> agents_pb2.AttemptStatus:
    """The report as its message. A status holding what the message cannot carry (an exit code past int32,
    a time out of the Timestamp's range, a reason that is not UTF-8) is fitted to it, with a log line: one
    such report must not fail every hello that replays it, nor stall the reports queued behind it."""
    status = _fitted(status)
    at = Timestamp()
    at.FromNanoseconds(int(status.at * 1e9))
    return agents_pb2.AttemptStatus(job_id=status.job_id, attempt=status.attempt, state=status.state,
                                    reason=status.reason, exit_code=status.exit_code, at=at, address=status.address,
                                    nodes=[agents_pb2.NodeRoom(node=node, held=jobs_pb2.Resources(milli=held))
                                           for node, held in status.nodes])


def _fitted(status: AttemptStatus) -> AttemptStatus:
    exit_code = min(max(status.exit_code, _INT32[0]), _INT32[1])
    at = status.at if math.isfinite(status.at) and 0 <= status.at <= _LATEST_AT else 0.0  # 0: not said
    reason = status.reason.encode("utf-8", "replace").decode("utf-8")
    if (exit_code, at, reason) == (status.exit_code, status.at, status.reason):
        return status
    log.warning("status fixed to fit its message", extra={
        "job_id": status.job_id, "attempt": status.attempt, "exit_code": status.exit_code, "at": status.at})
    return dataclasses.replace(status, exit_code=exit_code, at=at, reason=reason)


def _capacity_message(report: CapacityReport, applied_through: int) -> agents_pb2.Capacity:
    return agents_pb2.Capacity(allocatable=jobs_pb2.Resources(milli=report.allocatable),
                               free=jobs_pb2.Resources(milli=report.free),
                               largest_free_node=jobs_pb2.Resources(milli=report.largest_free_node),
                               applied_through=applied_through,
                               node_free=[jobs_pb2.Resources(milli=node) for node in report.node_free],
                               node_names=list(report.node_names))


class Agent:
    def __init__(self, settings: AgentSettings, backend: Backend):
        self.settings = settings
        self.backend = backend
        self.connected = threading.Event()
        self._lock = threading.Lock()
        self._seq = 0
        self._unacked: dict[int, AttemptStatus] = {}  # status reports the dispatcher has not recorded yet
        self._out: queue.Queue | None = None  # the current connection's outgoing messages
        self._applied = 0  # the last command id this process applied
        self._heartbeat_queued = False  # one queued heartbeat is enough: it reads capacity when sent
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._call = None
        self._thread: threading.Thread | None = None
        self._addresses = settings.addresses
        self.address = self._addresses[0]  # the replica dialled last (or now)
        # A registry of its own (several agents share one process); serve it with agent.metrics.serve.
        self.metrics = AgentMetrics(settings.cluster, unacked=lambda: len(self._unacked))

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Agent:
        self.backend.start(self._on_status)
        self._thread = threading.Thread(target=self.run, name=f"agent-{self.settings.cluster}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if self._thread:
            self._thread.join(5)
        self.backend.stop()

    def run(self) -> None:
        backoff = self.settings.backoff_initial_s
        turn = 0
        while not self._stop.is_set():
            while self._paused.is_set() and not self._stop.wait(0.05):
                pass
            started = time.monotonic()
            self.address = self._addresses[turn % len(self._addresses)]
            turn += 1  # whatever ends this connection, the next dial goes to the next replica
            try:
                self._connect_once()
            except transport.TransportError as exc:  # unreadable TLS files: they may be fixed while we wait
                log.warning("cannot dial the dispatcher", extra={"cluster": self.settings.cluster, "error": str(exc)})
                backoff = self.settings.backoff_max_s
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                code = exc.code() if hasattr(exc, "code") else None
                log.warning("dispatcher link lost; reconnecting", extra={"cluster": self.settings.cluster,
                                                                        "address": self.address, "code": str(code)})
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                            grpc.StatusCode.NOT_FOUND):
                    backoff = self.settings.backoff_max_s  # will not fix itself quickly
            except Exception:  # a backend failure: drop this connection, keep the agent alive, try again
                if self._stop.is_set():
                    return
                log.exception("agent connection failed; reconnecting", extra={"cluster": self.settings.cluster})
            finally:
                self.connected.clear()
                self.metrics.connected.set(0)
            if time.monotonic() - started > 5 * self.settings.heartbeat_s:
                backoff = self.settings.backoff_initial_s  # the link was up for a while: start over
            self._stop.wait(reconnect_delay(backoff))
            backoff = min(backoff * 2, self.settings.backoff_max_s)
            if not self._stop.is_set():
                self.metrics.reconnects.inc()  # the loop dials again

    # -- one connection --------------------------------------------------------------------------
    def _connect_once(self) -> None:
        # A new channel per connection reads the TLS files again: a rotated certificate is used from here on.
        channel = transport.channel(self.address, self.settings.tls, options=[
            ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.max_receive_message_length", 64 << 20)])
        out: queue.Queue = queue.Queue()
        batches = threading.Event()  # the dispatcher's welcome said it reads batches
        log_reads: dict[int, threading.Event] = {}  # this connection's log requests being read, by request id
        # (source, its answers) to write back into the cluster's API server (None: the link ended)
        answers: queue.Queue = queue.Queue()
        metadata = [("authorization", f"Bearer {self.settings.token}")] if self.settings.token else []
        try:
            with self._lock:
                hello = agents_pb2.Hello(cluster=self.settings.cluster, agent_version=VERSION,
                                         inventory=[_status_message(s) for s in self._inventory()],
                                         capacity=self._capacity(), reads_batches=True)
                out.put(agents_pb2.AgentMessage(hello=hello))
                self._heartbeat_queued = False
                for seq in sorted(self._unacked):
                    out.put(self._report(seq, self._unacked[seq]))
                self._out = out
            call = agents_pb2_grpc.AgentsStub(channel).Connect(self._outgoing(out, batches), metadata=metadata)
            with self._lock:
                self._call = call
            for received in call:
                for message in received.batch.messages if received.WhichOneof("kind") == "batch" else (received,):
                    kind = message.WhichOneof("kind")
                    if kind == "welcome":
                        self._configure(message.welcome.cluster_spec_json)
                        if message.welcome.reads_batches:
                            batches.set()
                        sources = self._api_server_sources(message.welcome)
                        if sources:
                            threading.Thread(target=self._api_server_loop, args=(sources, out, answers), daemon=True,
                                             name=f"api-server-{self.settings.cluster}").start()
                        self.connected.set()
                        self.metrics.connected.set(1)
                        log.info("connected to the dispatcher", extra={"cluster": self.settings.cluster,
                                                                      "address": self.address})
                    elif kind == "command":
                        self._apply(message.command, out)
                    elif kind == "logs":
                        self._read_logs(message.logs, out, log_reads)
                    elif kind == "log_stop" and message.log_stop.request_id in log_reads:
                        log_reads[message.log_stop.request_id].set()
                    elif kind == "intake_answers":
                        answers.put((self.backend.intake, [
                            IntakeAnswer(a.uid, a.job_id, a.state, a.reason, a.cluster, a.attempt, a.error)
                            for a in message.intake_answers.answers]))
                    elif kind == "admin_outcomes":
                        answers.put((self.backend.admin_objects, [
                            AdminOutcome(o.kind, o.name, o.accepted, o.message, o.deleted, o.guaranteed, o.max, o.used)
                            for o in message.admin_outcomes.outcomes]))
                    elif kind == "status_ack":
                        with self._lock:
                            for seq in [s for s in self._unacked if s <= message.status_ack.seq]:
                                del self._unacked[seq]
        finally:
            with self._lock:
                self._out = None
                self._call = None
            for stopped in list(log_reads.values()):  # nobody is left to read them
                stopped.set()
            answers.put(None)
            out.put(None)
            channel.close()

    def _outgoing(self, out: queue.Queue, batches: threading.Event):
        """The stream's messages: what is queued on `out`, a heartbeat after heartbeat_s of silence. Once
        the dispatcher said it reads batches, what is queued at that moment goes as one message (up to
        MAX_BATCH: after a long outage thousands of reports wait, and one message must stay far under
        gRPC's limit)."""
        while True:
            try:
                ready = [out.get(timeout=self.settings.heartbeat_s)]
            except queue.Empty:
                ready = [_HEARTBEAT]
            while batches.is_set() and ready[-1] is not None and len(ready) < MAX_BATCH:
                try:
                    ready.append(out.get_nowait())
                except queue.Empty:
                    break
            messages = [self._heartbeat() if item is _HEARTBEAT else item for item in ready if item is not None]
            if len(messages) > 1:
                yield agents_pb2.AgentMessage(batch=agents_pb2.AgentMessages(messages=messages))
            else:
                yield from messages
            if ready[-1] is None:
                return

    def _heartbeat(self) -> agents_pb2.AgentMessage:
        with self._lock:
            self._heartbeat_queued = False
            return agents_pb2.AgentMessage(heartbeat=agents_pb2.Heartbeat(capacity=self._capacity()))

    def _apply(self, command: agents_pb2.Command, out: queue.Queue) -> None:
        kind = command.WhichOneof("kind")
        if kind == "dispatch":
            d = command.dispatch
            spec = json.loads(d.spec_json)
            with self.metrics.backend_errors.count_exceptions():
                created = self.backend.create_attempt(d.job_id, d.attempt, spec, tuple(d.avoid_nodes))
            if created:
                self.metrics.attempts_created.inc()
            log.info("attempt created" if created else "attempt already existed",
                     extra={"job_id": d.job_id, "attempt": d.attempt})
        elif kind == "cancel":
            with self.metrics.backend_errors.count_exceptions():
                self.backend.delete_attempt(command.cancel.job_id, command.cancel.attempt)
            self.metrics.attempts_deleted.inc()
        self.metrics.command_applied(kind).inc()
        with self._lock:
            self._applied = max(self._applied, command.id)
            out.put(agents_pb2.AgentMessage(ack=agents_pb2.CommandAck(command_ids=[command.id])))
            self._queue_heartbeat(out)

    def _api_server_sources(self, welcome: agents_pb2.Welcome) -> list:
        """What of the cluster's API server goes to this dispatcher, as (source, the message of what it sends, at
        most how many in one): the Jobs of the kubectl front door, and the management cluster's sluice.io
        resources, whole (applied all or nothing); those the backend has and the dispatcher takes."""
        sources = []
        if welcome.takes_intake and (intake := getattr(self.backend, "intake", None)) is not None:
            sources.append((intake, lambda mentions: agents_pb2.AgentMessage(intake=agents_pb2.Intake(jobs=[
                agents_pb2.IntakeJob(uid=m.uid, namespace=m.namespace, name=m.name,
                                     document_json=json.dumps(m.document), deleting=m.deleting)
                for m in mentions])), MAX_INTAKE))
        if welcome.takes_admin_resources and (admin := getattr(self.backend, "admin_objects", None)) is not None:
            sources.append((admin, lambda resources: agents_pb2.AgentMessage(
                admin_resources=agents_pb2.AdminResources(resources=[
                    agents_pb2.AdminResource(kind=r.kind, name=r.name, document_json=json.dumps(r.document),
                                             deleting=r.deleting) for r in resources])), None))
        return sources

    def _api_server_loop(self, sources: list, out: queue.Queue, answers: queue.Queue) -> None:
        """One connection's traffic with the cluster's API server: every API_SERVER_INTERVAL_S, send what each
        source has to tell the dispatcher; write each answer back as it comes. Ends with the connection."""
        due = 0.0
        while True:
            try:
                got = answers.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                got = ()
            if got is None:
                return
            try:
                if got:
                    source, payload = got
                    source.answered(payload)
                    continue
                due = time.monotonic() + API_SERVER_INTERVAL_S
                for source, message, most in sources:
                    items = source.pending()
                    step = most or max(len(items), 1)
                    for lo in range(0, len(items), step):
                        out.put(message(items[lo:lo + step]))
            except Exception:  # the cluster's API failing: looked at again next time
                log.exception("the cluster's API server could not be read or written",
                              extra={"cluster": self.settings.cluster})

    def _read_logs(self, request: agents_pb2.LogRequest, out: queue.Queue, reads: dict[int, threading.Event]) -> None:
        """Read a log request on a thread of its own (a followed pod may send for hours), its lines queued on
        `out` as PodLogLines, then one that ends it, saying why when the logs cannot be read."""
        stopped = reads[request.request_id] = threading.Event()

        def send(lines: list, **end) -> None:
            out.put(agents_pb2.AgentMessage(log_lines=agents_pb2.PodLogLines(request_id=request.request_id,
                                                                             lines=lines, **end)))

        def read() -> None:
            lines, size = [], 0
            try:
                for pod, line in self.backend.logs(request.job_id, request.attempt, pod=request.pod,
                                                   pod_set=request.pod_set, tail_lines=request.tail_lines,
                                                   follow=request.follow, stopped=stopped):
                    if len(line) > LOG_LINE_BYTES:
                        line = f"{line[:LOG_LINE_BYTES]}... ({len(line) - LOG_LINE_BYTES} more characters cut)"
                    lines.append(jobs_pb2.LogLine(pod=pod, line=line))
                    size += len(line) + len(pod)
                    if size >= LOG_BYTES or request.follow:  # a followed pod's lines go as they come
                        send(lines)
                        lines, size = [], 0
                    if stopped.is_set():
                        return
                send(lines, end=True)
            except LogsGone as exc:
                send(lines, end=True, error=str(exc), gone=True)
            except Exception as exc:  # the cluster's API failing: the caller is told, the agent goes on
                log.warning("reading logs failed", extra={"job_id": request.job_id, "attempt": request.attempt,
                                                         "error": str(exc)})
                send(lines, end=True, error=f"the cluster could not read the logs: {exc}")
            finally:
                reads.pop(request.request_id, None)

        threading.Thread(target=read, name=f"logs-{request.job_id}", daemon=True).start()

    # -- helpers ---------------------------------------------------------------------------------
    def _configure(self, cluster_spec_json: str) -> None:
        """Hand the Cluster object's document to a backend that reads its settings from it (the kubernetes
        backend: namespaces, gang start timeout, pod policy), before any command of this connection."""
        configure = getattr(self.backend, "configure", None)
        if configure is not None and cluster_spec_json:
            configure(json.loads(cluster_spec_json))

    def _inventory(self) -> list[AttemptStatus]:
        """What the cluster holds; for an attempt with unacked reports, the earliest of them instead.

        The dispatcher reconciles the hello before it reads the re-sent reports. Starting each attempt's
        story where the dispatcher lost it means every status arrives in order (RUNNING before SUCCEEDED,
        even if both happened while the link was down), and an attempt whose result the backend has
        already forgotten is not taken for lost.
        """
        with self.metrics.backend_errors.count_exceptions():
            inventory = self.backend.inventory()
        listed = {(s.job_id, s.attempt): s for s in inventory}
        earliest: dict[tuple[int, int], AttemptStatus] = {}
        for seq in sorted(self._unacked):
            status = self._unacked[seq]
            earliest.setdefault((status.job_id, status.attempt), status)
        return list({**listed, **earliest}.values())

    # -- holding the link (maintenance, fault tests) ---------------------------------------------
    def pause(self) -> None:
        """Drop the link to the dispatcher and keep it down until resume(); the cluster keeps running
        its jobs and the agent keeps their statuses, to deliver in order when the link is back."""
        self._paused.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def resume(self) -> None:
        self._paused.clear()

    def _capacity(self) -> agents_pb2.Capacity:
        # Read applied_through before the snapshot: the snapshot then holds at least those commands.
        applied = self._applied
        with self.metrics.backend_errors.count_exceptions():
            report = self.backend.capacity()
        return _capacity_message(report, applied)

    def _report(self, seq: int, status: AttemptStatus) -> agents_pb2.AgentMessage:
        return agents_pb2.AgentMessage(status=agents_pb2.StatusReport(seq=seq, status=_status_message(status)))

    def _on_status(self, status: AttemptStatus) -> None:
        with self._lock:
            self._seq += 1
            self._unacked[self._seq] = status
            if self._out is not None:
                self._out.put(self._report(self._seq, status))
                if status.state in FINAL_STATES:
                    self._queue_heartbeat(self._out)  # capacity was freed: say so now, not at the next tick

    def _queue_heartbeat(self, out: queue.Queue) -> None:
        if not self._heartbeat_queued:
            self._heartbeat_queued = True
            out.put(_HEARTBEAT)
