"""The agent link, driven by a scripted agent speaking the real protocol over real gRPC.

Covers delivery until ack, fencing of stale attempts, capacity counted exactly once, token binding,
reconnection of real agents, and the health service.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from concurrent import futures
from datetime import UTC

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice.client import Client, ClientError, event_dict
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.transport import PLAINTEXT
from sluice.v1 import agents_pb2, agents_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from tests.integration.test_spine import job_doc

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: default}
spec: {serviceClasses: [standard]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: alpha}
spec: {tier: onprem, site: dc-1}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: beta}
spec: {tier: onprem, site: dc-2}
"""
CPU8 = {"cpu": 8000}


@pytest.fixture
def dispatcher(db_url):
    from dispatcher.store import clusters as cluster_store
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        d.admin = tokens.create(session, "admin", "admin")
        d.agent_tokens = {c: tokens.create(session, "agent", f"agent-{c}", c) for c in ("alpha", "beta")}
    d.client = Client(ClientConfig(d.address, d.admin, timeout_s=10, insecure=True))
    yield d
    d.client.close()
    d.stop()


class ScriptedAgent:
    """A hand-driven agent: every message is sent by the test; replies are collected."""

    def __init__(self, address: str, token: str, cluster: str, capacity=CPU8, applied_through=0, inventory=(),
                 reads_batches=False, credentials: grpc.ChannelCredentials | None = None, own_connection=False):
        """credentials: TLS (with the agent's client certificate, on the agent port) instead of plaintext;
        token "": none sent. own_connection: a TCP connection of its own (gRPC otherwise shares one among the
        process's channels to the same address)."""
        options = [("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.use_local_subchannel_pool", int(own_connection))]
        self.channel = (grpc.secure_channel(address, credentials, options=options) if credentials
                        else grpc.insecure_channel(address, options=options))
        self.outgoing: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()  # a batch's messages one by one
        self.received: list[str] = []  # the kind of each stream message, a batch as "batch"
        self.send(hello=agents_pb2.Hello(cluster=cluster, inventory=list(inventory),
                                         capacity=self.capacity(capacity, applied_through),
                                         reads_batches=reads_batches))
        self.call = agents_pb2_grpc.AgentsStub(self.channel).Connect(
            iter(self.outgoing.get, None), metadata=[("authorization", f"Bearer {token}")] if token else None)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @staticmethod
    def capacity(free, applied_through=0):
        return agents_pb2.Capacity(allocatable=jobs_pb2.Resources(milli=CPU8), free=jobs_pb2.Resources(milli=free),
                                   largest_free_node=jobs_pb2.Resources(milli=free), applied_through=applied_through)

    def _read(self):
        try:
            for message in self.call:
                self.received.append(message.WhichOneof("kind"))
                for one in message.batch.messages if message.WhichOneof("kind") == "batch" else (message,):
                    self.replies.put(one)
        except grpc.RpcError as exc:
            self.replies.put(exc)

    def send(self, **kind):
        self.outgoing.put(agents_pb2.AgentMessage(**kind))

    def next(self, kind: str, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            message = self.replies.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(message, Exception):
                raise message
            if message.WhichOneof("kind") == kind:
                return getattr(message, kind)

    def status(self, seq, job_id, attempt, state, reason=""):
        self.send(status=agents_pb2.StatusReport(seq=seq, status=agents_pb2.AttemptStatus(
            job_id=job_id, attempt=attempt, state=state, reason=reason)))
        assert self.next("status_ack").seq == seq

    def close(self):
        self.outgoing.put(None)
        self.channel.close()


def dispatched_job(dispatcher, agent: ScriptedAgent) -> tuple[int, agents_pb2.Command]:
    """Submit a small job and take (and ack) its dispatch command on the scripted agent."""
    [job_id] = dispatcher.client.submit([job_doc(cpu="1")])
    command = agent.next("command")
    agent.send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
    return job_id, command


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
    return value


def test_commands_are_resent_until_acked_and_never_after(dispatcher):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    agent.next("welcome")
    [job_id] = dispatcher.client.submit([job_doc(cpu="1")])
    first = agent.next("command")
    assert first.dispatch.job_id == job_id and first.dispatch.attempt == 1
    agent.close()  # gone before acking
    again = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha",
                          inventory=[agents_pb2.AttemptStatus(job_id=job_id, attempt=1, state="PENDING")])
    assert again.next("command").id == first.id  # delivered again: at-least-once
    again.send(ack=agents_pb2.CommandAck(command_ids=[first.id]))
    again.status(1, job_id, 1, "RUNNING")
    again.close()
    third = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha",
                          inventory=[agents_pb2.AttemptStatus(job_id=job_id, attempt=1, state="RUNNING")])
    third.next("welcome")
    with pytest.raises(queue.Empty):
        third.next("command", timeout=1.0)  # acked: never sent again
    assert dispatcher.client.get(job_id)["state"] == "RUNNING"
    third.close()


def test_a_dispatch_not_yet_sent_when_its_job_is_cancelled_is_never_sent(dispatcher):
    """Cancelled right after submit, before its agent got the dispatch: the agent gets the cancel alone, and
    creates no pods after the cancel."""
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    agent.next("welcome")
    agent.close()  # it reported room and went away: alpha takes jobs for a few seconds more
    [job_id] = dispatcher.client.submit([job_doc(cpu="1")])
    wait_for(lambda: dispatcher.client.get(job_id)["state"] == "DISPATCHED")
    dispatcher.client.cancel([job_id])
    back = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    command = back.next("command")
    assert command.WhichOneof("kind") == "cancel" and command.cancel.job_id == job_id, command
    with pytest.raises(queue.Empty):
        back.next("command", timeout=1.0)
    back.close()


def test_an_impossible_job_is_accepted_while_a_cluster_has_not_reported_and_refused_once_all_have(db_url):
    from dispatcher.store import clusters as cluster_store
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", schedule=False,  # no cycle rewrites the reason
                                  database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        admin = tokens.create(session, "admin", "admin")
        agent_tokens = {c: tokens.create(session, "agent", f"agent-{c}", c) for c in ("alpha", "beta")}
    client = Client(ClientConfig(d.address, admin, timeout_s=10, insecure=True))
    try:
        alpha = ScriptedAgent(d.address, agent_tokens["alpha"], "alpha")  # 8 cpu
        alpha.next("welcome")
        [job_id] = client.submit([job_doc(cpu="100")])  # beta has not reported: it might fit there
        reason = client.get(job_id)["reason"]
        assert reason.startswith("no cluster that has reported could ever run it: alpha: ") and \
            reason.endswith("; refused unless beta, which has not reported yet, can"), reason
        [small] = client.submit([job_doc(cpu="1")])
        many = client.submit([job_doc(cpu="100") for _ in range(120)])  # written by COPY: the same reasons
        assert {client.get(i)["reason"] for i in many[::40]} == {reason}
        beta = ScriptedAgent(d.address, agent_tokens["beta"], "beta")  # 8 cpu too
        beta.next("welcome")
        job = wait_for(lambda: (j := client.get(job_id))["state"] == "CANCELLED" and j)
        assert job["reason"].startswith("refused once every cluster had reported: no cluster could ever run it: "), \
            job
        assert client.get(small)["state"] == "QUEUED"
        assert {client.get(i)["state"] for i in many[::20]} == {"CANCELLED"}
        with pytest.raises(ClientError) as err:  # as a submit is refused now
            client.submit([job_doc(cpu="100")])
        assert "no cluster could ever run it" in err.value.message
        alpha.close()
        beta.close()
    finally:
        client.close()
        d.stop()


def test_stale_attempts_are_fenced_off(dispatcher):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    job_id, _ = dispatched_job(dispatcher, agent)
    agent.status(1, job_id, 7, "SUCCEEDED")  # an attempt that never existed
    agent.status(2, job_id, 1, "RUNNING")
    assert dispatcher.client.get(job_id)["state"] == "RUNNING"
    other = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["beta"], "beta")
    other.status(1, job_id, 1, "SUCCEEDED")  # right attempt, wrong cluster
    assert dispatcher.client.get(job_id)["state"] == "RUNNING"
    agent.status(3, job_id, 1, "SUCCEEDED")
    agent.status(4, job_id, 1, "SUCCEEDED")  # a repeat changes nothing
    job = dispatcher.client.get(job_id)
    assert job["state"] == "SUCCEEDED" and job["attempt"] == 1
    assert [e["to"] for e in dispatcher.client.describe(job_id)["events"]].count("SUCCEEDED") == 1
    agent.close()
    other.close()


def test_lost_attempt_is_requeued_as_a_new_attempt(dispatcher):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    job_id, _ = dispatched_job(dispatcher, agent)
    agent.status(1, job_id, 1, "RUNNING")
    agent.close()
    # The agent comes back holding nothing: the acked attempt is lost, the job goes back to the queue
    # and is dispatched again as attempt 2.
    back = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    command = back.next("command")
    assert (command.dispatch.job_id, command.dispatch.attempt) == (job_id, 2)
    reasons = [e["reason"] for e in dispatcher.client.describe(job_id)["events"]]
    assert any("attempt 1 was lost on alpha" in r for r in reasons)
    back.close()


def test_a_leader_counts_a_clusters_silence_only_from_when_it_took_over(dispatcher):
    """Every dispatcher was down for longer than alpha's lease (its agent could report to no one): the leader
    that takes over does not give alpha's running job up at once, but only after a whole lease from then."""
    from datetime import datetime, timedelta

    from sqlalchemy import text

    from dispatcher.scheduler.postgres_cycle import run_cycle
    from dispatcher.scheduler.takeover import Takeover
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    job_id, _ = dispatched_job(dispatcher, agent)
    agent.status(1, job_id, 1, "RUNNING")
    agent.close()
    with dispatcher.sessions.begin() as session:  # heard of last 10 minutes ago, before this leader started
        session.execute(text("UPDATE clusters SET last_seen_at = now() - interval '10 minutes' "
                             "WHERE name = 'alpha'"))
    ran = dispatcher.metrics.registry.get_sample_value("sluice_scheduling_cycles_total")
    dispatcher.client.submit([job_doc(cpu="100")])  # fits nowhere: wakes the leader's cycles
    wait_for(lambda: dispatcher.metrics.registry.get_sample_value("sluice_scheduling_cycles_total") >= ran + 2)
    job = dispatcher.client.get(job_id)
    assert (job["state"], job["attempt"], job["cluster"]) == ("RUNNING", 1, "alpha")
    now = datetime.now(UTC)  # a leader that took over 6 minutes ago has waited longer than the 5 minute lease
    settings = SchedulerSettings()
    run_cycle(dispatcher.sessions, settings, now, takeover=Takeover(now - timedelta(minutes=6), settings))
    assert dispatcher.client.get(job_id)["state"] == "QUEUED"  # attempt 1 lost; the next one once it can run
    assert any("longer than its lease (5m)" in e["reason"] for e in dispatcher.client.describe(job_id)["events"])


def test_orphans_are_cancelled(dispatcher):
    [job_id] = dispatcher.client.submit([job_doc(cpu="100")])  # fits nowhere yet: no capacity reported
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity={"cpu": 0},
                          inventory=[agents_pb2.AttemptStatus(job_id=job_id, attempt=3, state="RUNNING")])
    command = agent.next("command")
    assert command.WhichOneof("kind") == "cancel" and command.cancel.attempt == 3
    agent.close()


def test_objects_of_a_job_the_dispatcher_never_had_are_left_alone_and_the_agent_connects(dispatcher):
    # Another installation's objects, or ones from before the database was wiped: no cancel (the outbox
    # can only name jobs it has), and the hello still succeeds.
    [job_id] = dispatcher.client.submit([job_doc(cpu="100")])
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity={"cpu": 0},
                          inventory=[agents_pb2.AttemptStatus(job_id=job_id + 10_000, attempt=1, state="RUNNING"),
                                     agents_pb2.AttemptStatus(job_id=job_id, attempt=3, state="RUNNING")])
    assert agent.next("welcome").cluster == "alpha"
    command = agent.next("command")
    assert command.WhichOneof("kind") == "cancel" and (command.cancel.job_id, command.cancel.attempt) == (job_id, 3)
    with pytest.raises(queue.Empty):
        agent.next("command", timeout=1.0)
    agent.close()


def _raw_watch(dispatcher, rpc: str, token: str | None = None, **request):
    """The stream of Jobs.Watch or Jobs.WatchBatches itself, as each message arrives; and its channel."""
    channel = grpc.insecure_channel(dispatcher.address)
    call = getattr(jobs_pb2_grpc.JobsStub(channel), rpc)(  # a deadline: a test waiting for too many never hangs
        jobs_pb2.WatchRequest(**request), metadata=[("authorization", f"Bearer {token or dispatcher.admin}")],
        timeout=30)
    return call, channel


@pytest.mark.parametrize("rpc", ["WatchBatches", "Watch"])
def test_watch_delivers_an_event_that_commits_after_a_later_one(dispatcher, rpc):
    # Event ids are taken at insert: a longer transaction can commit a lower id after a later one.
    from dispatcher.store import channels
    from dispatcher.store.models import JobEvent
    [a, b] = dispatcher.client.submit([job_doc(cpu="100"), job_doc(cpu="100")])  # fit nowhere: stay queued
    seen: queue.Queue = queue.Queue()
    call, channel = _raw_watch(dispatcher, rpc)

    def read() -> None:
        try:
            for message in call:
                for event in message.events if rpc == "WatchBatches" else [message]:
                    seen.put(event_dict(event))
        except grpc.RpcError:  # cancelled at the end
            pass

    threading.Thread(target=read, daemon=True).start()

    def reasons_until(wanted: str) -> list[str]:
        got = []
        while wanted not in got:
            got.append(seen.get(timeout=10)["reason"])
        return got

    reasons_until("submitted") and reasons_until("submitted")
    slow = dispatcher.sessions()
    slow.begin()
    slow.add(JobEvent(job_id=a, attempt=0, from_state="QUEUED", to_state="QUEUED", reason="slow"))
    slow.flush()  # takes its id now, commits later
    with dispatcher.sessions.begin() as fast:
        fast.add(JobEvent(job_id=b, attempt=0, from_state="QUEUED", to_state="QUEUED", reason="fast"))
        channels.notify(fast, channels.EVENTS_CHANNEL)
    assert "slow" not in reasons_until("fast")
    channels.notify(slow, channels.EVENTS_CHANNEL)
    slow.commit()
    slow.close()
    assert reasons_until("slow")[-1] == "slow"
    call.cancel()
    channel.close()


def test_watch_batches_sends_the_events_read_together_in_one_message(dispatcher):
    ids = dispatcher.client.submit([job_doc(cpu="100") for _ in range(3)])  # one commit; they stay queued
    call, channel = _raw_watch(dispatcher, "WatchBatches")
    first = next(call)
    assert [(e.job_id, e.to_state) for e in first.events] == [(i, "QUEUED") for i in ids]
    # Resumed after the second, the stream starts at the third; and one job's events only.
    resumed, again = _raw_watch(dispatcher, "WatchBatches", after_event_id=first.events[1].id)
    assert [e.job_id for e in next(resumed).events] == [ids[2]]
    one, alone = _raw_watch(dispatcher, "WatchBatches", job_id=ids[1])
    assert [e.job_id for e in next(one).events] == [ids[1]]
    for c, ch in ((call, channel), (resumed, again), (one, alone)):
        c.cancel()
        ch.close()


def test_watch_batches_splits_a_poll_of_long_events_over_messages(dispatcher):
    from dispatcher.store import channels
    from dispatcher.store.models import JobEvent
    [job_id] = dispatcher.client.submit([job_doc(cpu="100")])
    with dispatcher.sessions.begin() as session:  # 4 events of 1.5 MB each: 6 MB in one poll
        for n in range(4):
            session.add(JobEvent(job_id=job_id, attempt=0, from_state="QUEUED", to_state="QUEUED",
                                 reason=str(n) * 1_500_000))
        channels.notify(session, channels.EVENTS_CHANNEL)
    call, channel = _raw_watch(dispatcher, "WatchBatches", job_id=job_id)
    sizes = [len(next(call).events) for _ in range(2)]
    assert sizes == [3, 2]  # one poll of 5 events: the submit's and two long ones under 4 MiB, then two
    call.cancel()
    channel.close()
    with Client(ClientConfig(dispatcher.address, dispatcher.admin, timeout_s=10, insecure=True)) as client:
        events = client.watch(job_id)
        assert [e["reason"][:1] for e in (next(events) for _ in range(5))][1:] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("rpc", ["WatchBatches", "Watch"])
def test_watch_refuses_a_bad_token(dispatcher, rpc):
    call, channel = _raw_watch(dispatcher, rpc, token="sl_wrong")
    with pytest.raises(grpc.RpcError) as err:
        next(call)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
    # not taken for an old server
    with Client(ClientConfig(dispatcher.address, "sl_wrong", timeout_s=10, insecure=True)) as bad:
        with pytest.raises(ClientError) as refused:
            next(bad.watch())
    assert refused.value.code == "UNAUTHENTICATED"


class _OlderJobs(jobs_pb2_grpc.JobsServicer):
    """A dispatcher from before WatchBatches: its Watch streams one message per event."""

    def Watch(self, request, context):
        for n in range(request.after_event_id + 1, request.after_event_id + 3):
            yield jobs_pb2.JobEvent(id=n, job_id=7, to_state="QUEUED", reason=f"event {n}")


def test_client_watch_reads_an_older_dispatchers_watch():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    jobs_pb2_grpc.add_JobsServicer_to_server(_OlderJobs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client(ClientConfig(f"127.0.0.1:{port}", "sl_any", timeout_s=10, insecure=True)) as client:
            events = client.watch(after_event_id=4)
            assert [(e["id"], e["reason"]) for e in (next(events), next(events))] == [(5, "event 5"), (6, "event 6")]
    finally:
        server.stop(None)


def test_an_agents_batch_is_applied_as_its_messages_in_order(dispatcher):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity=CPU8)
    assert agent.next("welcome").reads_batches
    [job_id] = dispatcher.client.submit([job_doc(cpu="3")])
    command = agent.next("command")
    def status(seq, state):
        return agents_pb2.AgentMessage(status=agents_pb2.StatusReport(
            seq=seq, status=agents_pb2.AttemptStatus(job_id=job_id, attempt=1, state=state)))
    agent.send(batch=agents_pb2.AgentMessages(messages=[
        agents_pb2.AgentMessage(ack=agents_pb2.CommandAck(command_ids=[command.id])),
        status(1, "PENDING"), status(2, "RUNNING"),
        agents_pb2.AgentMessage(heartbeat=agents_pb2.Heartbeat(
            capacity=agent.capacity({"cpu": 5000}, applied_through=command.id)))]))
    assert agent.next("status_ack").seq == 2
    assert dispatcher.client.get(job_id)["state"] == "RUNNING"
    free = {c["name"]: c["free"] for c in dispatcher.client.clusters()}["alpha"]
    assert free.get("cpu") == "5"  # the heartbeat's report holds the acked command: counted once
    assert "batch" not in agent.received  # this agent's hello did not ask for batches
    agent.close()


def test_an_agent_that_reads_batches_gets_the_commands_of_one_read_in_one_message(dispatcher):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity=CPU8,
                          reads_batches=True)
    agent.next("welcome")
    ids = dispatcher.client.submit([job_doc(cpu="1") for _ in range(3)])  # one commit, one cycle
    assert sorted(agent.next("command").dispatch.job_id for _ in ids) == ids
    assert agent.received == ["welcome", "batch"]
    agent.close()


def test_commands_of_large_documents_are_split_over_messages(dispatcher):
    from dispatcher.api.streams import RUN_BYTES, runs
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity=CPU8,
                          reads_batches=True)
    agent.next("welcome")
    big = job_doc(cpu="1")
    big["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["args"] = ["x" * 900_000]
    ids = dispatcher.client.submit([big] * 5)  # 4.5 MB of commands in one outbox read
    assert sorted(agent.next("command").dispatch.job_id for _ in ids) == ids
    assert agent.received == ["welcome", "batch", "command"]  # 4 in one message, under RUN_BYTES; then 1
    # A message larger than the limit goes alone; the runs keep the order.
    def small(n):
        return agents_pb2.DispatcherMessage(status_ack=agents_pb2.StatusAck(seq=n))
    huge = agents_pb2.DispatcherMessage(command=agents_pb2.Command(id=9, dispatch=agents_pb2.DispatchAttempt(
        spec_json="x" * 100)))
    assert runs([small(1), small(2), huge, small(3)], limit=50) == [[small(1), small(2)], [huge], [small(3)]]
    assert runs([]) == [] and RUN_BYTES < 64 << 20
    agent.close()


def test_in_flight_dispatches_are_counted_exactly_once(dispatcher):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity=CPU8)
    agent.next("welcome")
    def free():
        return {c["name"]: c["free"].get("cpu") for c in dispatcher.client.clusters()}["alpha"]
    wait_for(lambda: free() == "8")
    [job_id] = dispatcher.client.submit([job_doc(cpu="3")])
    command = agent.next("command")
    # Not yet in any report: the dispatcher subtracts it itself.
    assert free() == "5"
    # A report taken before the command was applied still does not hold it: still counted once.
    agent.send(heartbeat=agents_pb2.Heartbeat(capacity=agent.capacity(CPU8, applied_through=command.id - 1)))
    wait_for(lambda: free() == "5")
    # A report that holds it: the report alone counts it.
    agent.send(heartbeat=agents_pb2.Heartbeat(capacity=agent.capacity({"cpu": 5000}, applied_through=command.id)))
    time.sleep(0.3)
    assert free() == "5"
    # Once it ends and the report shows the room again, all of it is free.
    agent.status(1, job_id, 1, "SUCCEEDED")
    agent.send(heartbeat=agents_pb2.Heartbeat(capacity=agent.capacity(CPU8, applied_through=command.id)))
    wait_for(lambda: free() == "8")
    agent.close()


def test_agent_tokens_are_bound_to_their_cluster_and_role(dispatcher):
    wrong = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "beta")
    with pytest.raises(grpc.RpcError) as err:
        wrong.next("welcome")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    unknown = ScriptedAgent(dispatcher.address, dispatcher.admin, "nowhere")
    with pytest.raises(grpc.RpcError) as err:
        unknown.next("welcome")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with Client(ClientConfig(dispatcher.address, dispatcher.agent_tokens["alpha"], insecure=True)) as as_agent:
        with pytest.raises(ClientError) as err:
            as_agent.list()
    assert err.value.code == "PERMISSION_DENIED"


def test_users_submit_only_to_their_queues(dispatcher):
    from dispatcher.store import clusters as cluster_store
    with dispatcher.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(
            "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: vision}\nspec: {members: [alice]}\n"))
        alice = tokens.create(session, "user", "alice")
        bob = tokens.create(session, "user", "bob")
    doc = job_doc(cpu="1")
    doc["spec"]["queue"] = "vision"
    with Client(ClientConfig(dispatcher.address, alice, insecure=True)) as client:
        assert client.submit([doc])
    with Client(ClientConfig(dispatcher.address, bob, insecure=True)) as client:
        with pytest.raises(ClientError) as err:
            client.submit([doc])
    assert err.value.code == "PERMISSION_DENIED" and "bob may not submit to queue 'vision'" in err.value.message
    [mine] = Client(ClientConfig(dispatcher.address, alice, insecure=True)).submit([doc])
    with Client(ClientConfig(dispatcher.address, bob, insecure=True)) as client:
        with pytest.raises(ClientError) as err:
            client.cancel([mine])
    assert (err.value.code, err.value.message) == ("NOT_FOUND", f"job {mine} not found")  # not even shown to bob
    assert dispatcher.client.get(mine)["state"] != "CANCELLED"
    with Client(ClientConfig(dispatcher.address, alice, insecure=True)) as client:
        assert client.cancel([mine])[0]["state"] == "CANCELLED"


def test_health_service_reports_serving(dispatcher):
    with grpc.insecure_channel(dispatcher.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_real_agent_reconnects_after_a_dispatcher_restart(db_url, tmp_path):
    from agent.backends.sim.cluster import SimCluster, SimConfig
    from agent.connection import Agent, AgentSettings
    settings = ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))
    first = Dispatcher(settings).start()
    from dispatcher.store import clusters as cluster_store
    with first.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        admin = tokens.create(session, "admin", "admin")
        token = tokens.create(session, "agent", "agent-alpha", "alpha")
    port = first.port
    agent = Agent(AgentSettings("alpha", first.address, token, backoff_max_s=0.5, tls=PLAINTEXT),
                  SimCluster(SimConfig(nodes=1, node=CPU8, time_scale=0.1))).start()
    assert agent.connected.wait(10)
    with Client(ClientConfig(first.address, admin, insecure=True)) as client:
        [job_id] = client.submit([job_doc(cpu="1", duration="20s")])  # 2 s at this time scale
        wait_for(lambda: client.get(job_id)["state"] == "RUNNING")
    first.stop()
    wait_for(lambda: not agent.connected.is_set())
    second = Dispatcher(ServerSettings(listen=f"127.0.0.1:{port}", database=DatabaseSettings(url=db_url))).start()
    try:
        assert agent.connected.wait(15), "the agent did not reconnect by itself"
        with Client(ClientConfig(second.address, admin, insecure=True)) as client:
            wait_for(lambda: client.get(job_id)["state"] == "SUCCEEDED", timeout=20)
            assert client.get(job_id)["attempt"] == 1  # the same attempt ran through the outage
    finally:
        agent.stop()
        second.stop()


def test_outbox_writes_for_one_cluster_commit_in_id_order(dispatcher):
    """A writer holding a cluster's outbox lock makes the next writer wait, so ids commit in order."""
    from sqlalchemy import select

    from dispatcher.store import outbox as outbox_store
    from dispatcher.store.models import OutboxCommand
    [job_id] = dispatcher.client.submit([job_doc(cpu="100")])
    first = dispatcher.sessions()
    first.begin()
    outbox_store.add_cancel(first, "alpha", job_id, 1, "first")
    done = threading.Event()

    def second():
        with dispatcher.sessions.begin() as session:
            outbox_store.add_cancel(session, "alpha", job_id, 2, "second")
        done.set()
    threading.Thread(target=second, daemon=True).start()
    assert not done.wait(0.5), "the second writer did not wait for the first"
    first.commit()
    first.close()
    assert done.wait(5)
    with dispatcher.sessions() as session:
        rows = session.execute(select(OutboxCommand.id, OutboxCommand.attempt).where(
            OutboxCommand.job_id == job_id).order_by(OutboxCommand.id)).all()
    assert [r.attempt for r in rows] == [1, 2]


def test_a_cycle_does_not_commit_without_the_leader_lock(dispatcher):
    from datetime import datetime

    from dispatcher.scheduler.postgres_cycle import LostLeadership, run_cycle
    from dispatcher.scheduler.settings import SchedulerSettings
    with pytest.raises(LostLeadership):
        run_cycle(dispatcher.sessions, SchedulerSettings(), datetime.now(UTC), leader_pid=1)


def test_results_the_cluster_forgot_during_an_outage_still_arrive(db_url):
    """The backend drops finished attempts at once; the agent's unacked report still carries the result."""
    from agent.backends.sim.cluster import SimCluster, SimConfig
    from agent.connection import Agent, AgentSettings
    from dispatcher.store import clusters as cluster_store
    first = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    with first.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        admin = tokens.create(session, "admin", "admin")
        token = tokens.create(session, "agent", "agent-alpha", "alpha")
    port = first.port
    sim = SimCluster(SimConfig(nodes=1, node=CPU8, time_scale=0.1, final_retention=0.0))
    agent = Agent(AgentSettings("alpha", first.address, token, backoff_max_s=0.5, tls=PLAINTEXT), sim).start()
    assert agent.connected.wait(10)
    with Client(ClientConfig(first.address, admin, insecure=True)) as client:
        [job_id] = client.submit([job_doc(cpu="1", duration="40s")])  # 4 s at this time scale
        wait_for(lambda: client.get(job_id)["state"] == "RUNNING")
    first.stop(grace=0)  # the job finishes while the dispatcher is away
    assert sim.inventory()[0].state == "RUNNING"
    wait_for(lambda: sim.inventory() == [], timeout=10)
    second = Dispatcher(ServerSettings(listen=f"127.0.0.1:{port}", database=DatabaseSettings(url=db_url))).start()
    try:
        assert agent.connected.wait(15)
        with Client(ClientConfig(second.address, admin, insecure=True)) as client:
            job = wait_for(lambda: (j := client.get(job_id))["state"] in ("SUCCEEDED", "QUEUED", "DISPATCHED") and j)
            assert job["state"] == "SUCCEEDED" and job["attempt"] == 1, job
    finally:
        agent.stop()
        second.stop()


def test_jobs_deeper_than_the_head_say_how_many_are_ahead(dispatcher):
    deep = SchedulerSettings().per_queue + 6  # the last few are beyond the heads a cycle reads
    ids = dispatcher.client.submit([job_doc(cpu="1") for _ in range(deep)])  # no agent: nothing can start
    wait_for(lambda: dispatcher.client.get(ids[0])["reason"] != "waiting behind 0 jobs in queue default")
    assert dispatcher.client.get(ids[0])["reason"] == ("no cluster fits: alpha: unreachable (its agent has never "
                                                       "connected); beta: unreachable (its agent has never connected)")
    last = dispatcher.client.describe(ids[-1])
    assert last["reason"] == f"waiting behind {deep - 1} jobs in queue default" and last["queuePosition"] == deep


def test_prometheus_readings_count_each_attempt_once(dispatcher):
    """free = reading.free − requests of active attempts the reading does not show (and only those) + requests
    of the attempts it shows that succeeded since (and only those)."""
    from datetime import datetime

    from dispatcher.store import clusters as cluster_store
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity=CPU8)
    shown, _ = dispatched_job(dispatcher, agent)
    [unseen] = dispatcher.client.submit([job_doc(cpu="2")])
    agent.send(ack=agents_pb2.CommandAck(command_ids=[agent.next("command").id]))
    reading = {"allocatable": {"cpu": 16000}, "free": {"cpu": 15000}, "largestFreeNode": {"cpu": 8000},
               "attempts": [[shown, 1]]}  # the first job's pod is in it (1 cpu), the second's is not yet
    with dispatcher.sessions.begin() as session:
        cluster_store.record_prometheus(session, "alpha", reading, datetime.now(UTC))
    view = {c["name"]: c for c in dispatcher.client.clusters()}["alpha"]
    assert view["capacitySource"] == "prometheus"
    assert view["allocatable"] == {"cpu": "16"} and view["free"] == {"cpu": "13"}  # 15 − 2, not 15 − 1 − 2
    # Once the reading shows the second one too, nothing is subtracted on top of it.
    reading.update(free={"cpu": 13000}, attempts=[[shown, 1], [unseen, 1]])
    with dispatcher.sessions.begin() as session:
        cluster_store.record_prometheus(session, "alpha", reading, datetime.now(UTC))
    assert {c["name"]: c for c in dispatcher.client.clusters()}["alpha"]["free"] == {"cpu": "13"}
    # The first job succeeds before the next scrape: its room is free again though the reading still counts it,
    # and some node has at least its pod's room; a job cancelled meanwhile keeps its room until a reading
    # without it (its pods may still be terminating).
    agent.status(1, shown, 1, "SUCCEEDED")
    dispatcher.client.cancel([unseen])
    wait_for(lambda: dispatcher.client.get(shown)["state"] == "SUCCEEDED"
             and dispatcher.client.get(unseen)["state"] == "CANCELLED")
    reading.update(largestFreeNode={"cpu": 0})
    with dispatcher.sessions.begin() as session:
        cluster_store.record_prometheus(session, "alpha", reading, datetime.now(UTC))
    view = {c["name"]: c for c in dispatcher.client.clusters()}["alpha"]
    assert view["free"] == {"cpu": "14"} and view["largestFreeNode"] == {"cpu": "1"}, view
    # The next reading shows neither: nothing is added on top of it.
    reading.update(free={"cpu": 16000}, largestFreeNode={"cpu": 8000}, attempts=[])
    with dispatcher.sessions.begin() as session:
        cluster_store.record_prometheus(session, "alpha", reading, datetime.now(UTC))
    assert {c["name"]: c for c in dispatcher.client.clusters()}["alpha"]["free"] == {"cpu": "16"}
    # A reading older than the staleness bound is not trusted: the agent's report is used.
    with dispatcher.sessions.begin() as session:
        cluster_store.record_prometheus(session, "alpha", reading, datetime(2020, 1, 1, tzinfo=UTC))
    assert {c["name"]: c for c in dispatcher.client.clusters()}["alpha"]["capacitySource"] == "agent"
    agent.close()


def test_a_replica_that_does_not_schedule_never_leads_and_its_agents_get_the_leaders_commands(db_url):
    """`sluice dispatcher serve --no-schedule`: an API replica. Started first, it still never takes the
    leader lock; the scheduling replica (which no client or agent calls) decides, and the agent connected
    to the API replica gets the command through the outbox and NOTIFY."""
    from dispatcher.store import clusters as cluster_store
    api = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                    database=DatabaseSettings(url=db_url))).start()
    try:
        with api.sessions.begin() as session:
            cluster_store.apply_objects(session, load_objects(OBJECTS))
            admin = tokens.create(session, "admin", "admin")
            agent_token = tokens.create(session, "agent", "agent-alpha", "alpha")
        client = Client(ClientConfig(api.address, admin, timeout_s=10, insecure=True))
        agent = ScriptedAgent(api.address, agent_token, "alpha")
        agent.next("welcome")
        [job_id] = client.submit([job_doc(cpu="1")])
        time.sleep(1.5)  # more than a follower's retry: nobody schedules
        assert api.scheduler is None and client.get(job_id)["state"] == "QUEUED"
        scheduling = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None,
                                               database=DatabaseSettings(url=db_url))).start()
        try:
            # The new leader waits for the clusters heard from before it took over (scheduler/takeover.py):
            # alpha's agent heartbeats, as every agent does.
            assert scheduling.scheduler.is_leader.wait(10)
            agent.send(heartbeat=agents_pb2.Heartbeat(capacity=ScriptedAgent.capacity(CPU8)))
            command = agent.next("command")
            assert command.dispatch.job_id == job_id and scheduling.scheduler.is_leader.is_set()
        finally:
            scheduling.stop()
        agent.close()
        client.close()
    finally:
        api.stop()


class _OlderDispatcher(agents_pb2_grpc.AgentsServicer):
    """A dispatcher from before batches: its welcome does not say it reads them; it sends two commands,
    then keeps what the agent sends."""

    def __init__(self):
        self.hello = None
        self.received: queue.Queue = queue.Queue()

    def Connect(self, request_iterator, context):
        self.hello = next(request_iterator).hello
        yield agents_pb2.DispatcherMessage(welcome=agents_pb2.Welcome(cluster="alpha", heartbeat_seconds=1))
        for n in (1, 2):
            yield agents_pb2.DispatcherMessage(command=agents_pb2.Command(id=n, dispatch=agents_pb2.DispatchAttempt(
                job_id=n, attempt=1, spec_json=json.dumps(job_doc(cpu="1", duration="1h")))))

        def keep() -> None:
            try:
                for message in request_iterator:
                    self.received.put(message)
            except grpc.RpcError:  # the agent went away
                pass

        threading.Thread(target=keep, daemon=True).start()
        while context.is_active():
            time.sleep(0.05)


def test_an_agent_sends_an_older_dispatcher_one_message_at_a_time():
    from agent.backends.sim.cluster import SimCluster, SimConfig
    from agent.connection import Agent, AgentSettings
    older = _OlderDispatcher()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    agents_pb2_grpc.add_AgentsServicer_to_server(older, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    agent = Agent(AgentSettings("alpha", f"127.0.0.1:{port}", "sl_any", tls=PLAINTEXT),
                  SimCluster(SimConfig(nodes=1, node=CPU8)))
    try:
        agent.start()
        kinds, acked = [], set()
        while acked != {1, 2} or "status" not in kinds:  # both commands applied and acked, a report sent
            message = older.received.get(timeout=10)
            kinds.append(message.WhichOneof("kind"))
            acked.update(message.ack.command_ids)
        assert older.hello.reads_batches
        assert "batch" not in kinds
    finally:
        agent.stop()
        server.stop(None)


def test_an_agent_sends_what_is_queued_together_once_the_dispatcher_reads_batches():
    """Agent._outgoing, the generator the agent's stream sends from, with messages already queued."""
    from agent.backends.sim.cluster import SimCluster, SimConfig
    from agent.connection import _HEARTBEAT, MAX_BATCH, Agent, AgentSettings
    agent = Agent(AgentSettings("alpha", "127.0.0.1:1", "sl_any", tls=PLAINTEXT),
                  SimCluster(SimConfig(nodes=1, node=CPU8)))
    def ack(n):
        return agents_pb2.AgentMessage(ack=agents_pb2.CommandAck(command_ids=[n]))
    out, batches = queue.Queue(), threading.Event()
    for item in (ack(1), ack(2), _HEARTBEAT, ack(3), None):
        out.put(item)
    sent = agent._outgoing(out, batches)
    assert next(sent) == ack(1)  # not yet welcomed: one at a time
    batches.set()
    batch = next(sent)
    assert [m.WhichOneof("kind") for m in batch.batch.messages] == ["ack", "heartbeat", "ack"]
    assert batch.batch.messages[1].heartbeat.capacity.allocatable.milli == CPU8
    assert next(sent, "ended") == "ended"  # None: the stream ends after what came before it
    out.put(ack(4))
    out.put(None)
    assert list(agent._outgoing(out, batches)) == [ack(4)]  # one message alone is sent as itself
    for n in range(250):  # after a long outage: many reports wait; a message holds MAX_BATCH at most
        out.put(ack(n))
    out.put(None)
    sizes = [len(m.batch.messages) for m in agent._outgoing(out, batches)]
    assert sizes == [MAX_BATCH, MAX_BATCH, 50]


def _alpha(db_url):
    """A dispatcher with OBJECTS, its admin token and alpha's agent token."""
    from dispatcher.store import clusters as cluster_store
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        admin = tokens.create(session, "admin", "admin")
        token = tokens.create(session, "agent", "agent-alpha", "alpha")
    return d, admin, token


def test_a_job_whose_sim_exit_code_is_no_exit_code_ends_failed_with_its_reason(db_url, tmp_path):
    """Submit refuses such a job now; one accepted before (its document edited here, as an older dispatcher
    stored it) ends FAILED through the real link, not RUNNING for ever."""
    from sqlalchemy import text

    from agent.backends.sim.cluster import SimCluster, SimConfig
    from agent.connection import Agent, AgentSettings
    d, admin, token = _alpha(db_url)
    agent = None
    try:
        with Client(ClientConfig(d.address, admin, insecure=True)) as client:
            [job_id] = client.submit([job_doc(cpu="1", duration="1s", maxRetries=0)])  # no agent: it stays queued
            with d.sessions.begin() as session:
                session.execute(text(
                    """UPDATE jobs SET spec = jsonb_set(spec, '{spec,podSets,0,template,metadata,annotations}',
                                                        '{"sluice.io/sim-exit-code": "4294967297"}')
                       WHERE id = :id"""), {"id": job_id})
            agent = Agent(AgentSettings("alpha", d.address, token, backoff_max_s=0.5, tls=PLAINTEXT),
                          SimCluster(SimConfig(nodes=1, node=CPU8, time_scale=0.1))).start()
            job = wait_for(lambda: (j := client.get(job_id))["state"] in ("SUCCEEDED", "FAILED") and j, timeout=20)
            assert job["state"] == "FAILED", job
            assert job["reason"].endswith(f"pod {job_id}-1-w-0 failed: sluice.io/sim-exit-code '4294967297': must "
                                          f"be an integer from 0 to 255, got '4294967297'"), job["reason"]
    finally:
        if agent is not None:
            agent.stop()
        d.stop()


def test_a_status_no_message_can_carry_is_fixed_and_the_agent_says_hello_after_a_restart(db_url, tmp_path, caplog):
    """An earlier agent's ledger holds an attempt that ended with an exit code past int32: the restarted agent
    replays it in its hello, fitted to the message (and says so in its log), and the link comes up."""
    from sqlalchemy import text

    from agent.backends.sim.cluster import SimCluster, SimConfig
    from agent.connection import Agent, AgentSettings
    d, admin, token = _alpha(db_url)
    ledger = tmp_path / "alpha.ledger"
    settings = AgentSettings("alpha", d.address, token, backoff_max_s=0.5, tls=PLAINTEXT)
    agent = Agent(settings, SimCluster(SimConfig(nodes=1, node=CPU8, time_scale=0.1, ledger_path=ledger))).start()
    try:
        assert agent.connected.wait(10)
        with Client(ClientConfig(d.address, admin, insecure=True)) as client:
            [job_id] = client.submit([job_doc(cpu="1", duration="1000s", maxRetries=0)])
            wait_for(lambda: client.get(job_id)["state"] == "RUNNING")
            agent.stop()
            with open(ledger, "a") as f:
                f.write(f"ended {job_id} 1 FAILED 4294967297 {time.time()!r}\n")
            agent = Agent(settings, SimCluster(SimConfig(nodes=1, node=CPU8, time_scale=0.1,
                                                         ledger_path=ledger))).start()
            assert agent.connected.wait(10), "the agent never said hello again"
            job = wait_for(lambda: (j := client.get(job_id))["state"] == "FAILED" and j, timeout=20)
            assert job["attempt"] == 1
        with d.sessions.begin() as session:
            code = session.execute(text("SELECT exit_code FROM attempts WHERE job_id = :id"), {"id": job_id}).scalar()
        assert code == 2**31 - 1
        assert any(r.getMessage() == "status fixed to fit its message" and r.job_id == job_id
                   for r in caplog.records)
    finally:
        agent.stop()
        d.stop()


def test_a_reason_holding_a_nul_is_stored_with_it_shown_and_the_link_goes_on(dispatcher):
    """A Kubernetes termination message may hold a NUL, which Postgres cannot store: the report is applied
    with the NUL shown as U+FFFD, acked, and the link carries on (it used to end, and the replay to block it)."""
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    try:
        agent.next("welcome")
        job_id, command = dispatched_job(dispatcher, agent)
        agent.status(1, job_id, command.dispatch.attempt, "RUNNING")
        agent.status(2, job_id, command.dispatch.attempt, "FAILED", reason="oom\x00killed")
        wait_for(lambda: dispatcher.client.get(job_id)["state"] != "RUNNING")
        # The attempt's end, with its reason (the job itself may be queued again, or dispatched again, by now)
        events = dispatcher.client.describe(job_id)["events"]
        assert any("oom\ufffdkilled" in e["reason"] for e in events if e["from"] == "RUNNING"), events
        agent.send(heartbeat=agents_pb2.Heartbeat(capacity=agent.capacity(CPU8)))
        agent.status(3, job_id, command.dispatch.attempt, "FAILED")  # still heard: the link is up
    finally:
        agent.close()
