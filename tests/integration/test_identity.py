"""Who sees what, and how soon a revoked or expired token stops working, against a real dispatcher over
real gRPC: read scoping on every call that reads jobs, and revocation reaching open agent links and watches
(on the replica that revoked and on another one)."""
from __future__ import annotations

import threading
import time

import grpc
import pytest

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import clusters as cluster_store
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice.admin_client import AdminClient
from sluice.client import Client, ClientError
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.v1 import agents_pb2, jobs_pb2, jobs_pb2_grpc
from tests.integration.test_agent_link import ScriptedAgent, dispatcher, wait_for  # noqa: F401
from tests.integration.test_spine import job_doc


def plaintext(address: str, token: str, **kw) -> ClientConfig:
    """These dispatchers serve plaintext on loopback."""
    return ClientConfig(address, token, insecure=True, **kw)

VISION = "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: vision}\nspec: {members: [alice, carol]}\n"
BOUND_S = 3.0  # how long a revoked or expired token may keep an open stream (the cache alone keeps it 5 s)


def _user(dispatcher, subject: str) -> Client:
    with dispatcher.sessions.begin() as session:
        return Client(plaintext(dispatcher.address, tokens.create(session, "user", subject), timeout_s=10))


def _refused(call, code: str, *args) -> str:
    with pytest.raises(ClientError) as err:
        call(*args)
    assert err.value.code == code, err.value.message
    return err.value.message


def _first_batch(address: str, token: str, **request) -> list[int]:
    """The job ids of the first WatchBatches message (every event committed so far, read in one poll)."""
    with grpc.insecure_channel(address) as channel:
        call = jobs_pb2_grpc.JobsStub(channel).WatchBatches(
            jobs_pb2.WatchRequest(**request), metadata=[("authorization", f"Bearer {token}")], timeout=10)
        return sorted({e.job_id for e in next(call).events})


def _run_to_success(agent: ScriptedAgent, count: int) -> None:
    commands = [agent.next("command") for _ in range(count)]
    agent.send(ack=agents_pb2.CommandAck(command_ids=[c.id for c in commands]))
    seq = 0
    for state in ("RUNNING", "SUCCEEDED"):
        for c in commands:
            seq += 1
            agent.status(seq, c.dispatch.job_id, c.dispatch.attempt, state)


def test_users_see_their_own_jobs_and_those_of_their_queues_and_nothing_else(dispatcher):
    with dispatcher.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(VISION))
    alice, bob, carol = (_user(dispatcher, name) for name in ("alice", "bob", "carol"))
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    agent.next("welcome")
    [a1] = alice.submit([job_doc(name="a1")])
    [a2] = alice.submit([job_doc(name="a2", queue="vision")])
    [b1] = bob.submit([job_doc(name="b1")])
    _run_to_success(agent, 3)
    wait_for(lambda: all(dispatcher.client.get(j)["state"] == "SUCCEEDED" for j in (a1, a2, b1)))
    sees = {"admin": (dispatcher.client, {a1, a2, b1}), "alice": (alice, {a1, a2}), "carol": (carol, {a2}),
            "bob": (bob, {b1})}
    for name, (client, visible) in sees.items():
        assert {j["id"] for j in client.list()} == visible, name
        assert {j["id"] for j in client.list(queue="default")} == visible - {a2}, name
        token = client.config.token
        assert _first_batch(dispatcher.address, token) == sorted(visible), name
        for job_id in visible:
            assert client.get(job_id)["id"] == job_id
            assert client.describe(job_id)["id"] == job_id
            assert client.explain(job_id)["id"] == job_id
            assert _first_batch(dispatcher.address, token, job_id=job_id) == [job_id]
        for job_id in {a1, a2, b1} - visible:  # as if it did not exist: NOT_FOUND, the same words
            calls = {"get": client.get, "describe": client.describe, "explain": client.explain,
                     "cancel": lambda j, c=client: c.cancel([j]), "watch": lambda j, c=client: next(c.watch(job_id=j))}
            for what, call in calls.items():
                assert _refused(call, "NOT_FOUND", job_id) == f"job {job_id} not found", (name, what)
        users = {row["group"]: row["attempts"] for row in client.usage(by="user")["groups"]}
        expected = {"alice": len(visible & {a1, a2}), "bob": len(visible & {b1})}
        assert users == {k: v for k, v in expected.items() if v}, name
    assert dispatcher.client.get(a1)["state"] == "SUCCEEDED"  # bob's and carol's cancels changed nothing
    agent.close()
    for client in (alice, bob, carol):
        client.close()


def test_a_member_added_later_sees_the_queues_jobs_at_once(dispatcher):
    with dispatcher.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(VISION))
    alice, dave = _user(dispatcher, "alice"), _user(dispatcher, "dave")
    [job] = alice.submit([job_doc(queue="vision")])
    assert dave.list() == [] and _refused(lambda: dave.get(job), "NOT_FOUND")
    AdminClient(plaintext(dispatcher.address, dispatcher.admin)).add_member("vision", "dave")
    assert [j["id"] for j in dave.list()] == [job] and dave.get(job)["id"] == job
    alice.close()
    dave.close()


@pytest.fixture
def replicas(dispatcher, db_url):
    """The `dispatcher` fixture and a second replica on its database (serving API and agents only)."""
    other = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                      database=DatabaseSettings(url=db_url))).start()
    yield {"same": dispatcher, "other": other}
    other.stop()


def _token(admin: AdminClient, role: str, subject: str, **kw) -> tuple[int, str]:
    made = admin.create_token(role, subject, **kw)
    return made["id"], made["secret"]


def _agent_of_alpha(replicas, where: str, subject: str) -> tuple[AdminClient, int, str, ScriptedAgent]:
    """An admin's client, a new agent token of cluster alpha (its id and secret), and an agent welcomed with it by
    replica `where`."""
    admin = AdminClient(plaintext(replicas["same"].address, replicas["same"].admin))
    token_id, secret = _token(admin, "agent", subject, cluster="alpha")
    agent = ScriptedAgent(replicas[where].address, secret, "alpha")
    agent.next("welcome")
    return admin, token_id, secret, agent


def _ends_unauthenticated(agent: ScriptedAgent, since: float) -> None:
    """The agent's link ends with UNAUTHENTICATED within BOUND_S of `since`, no status ack sent before."""
    with pytest.raises(grpc.RpcError) as err:
        agent.next("status_ack", timeout=BOUND_S + 5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert time.monotonic() - since < BOUND_S


@pytest.mark.parametrize("where", ["same", "other"])
def test_a_revoked_agent_token_ends_its_link_and_its_report_is_not_applied(replicas, where):
    dispatcher = replicas["same"]
    admin, token_id, secret, agent = _agent_of_alpha(replicas, where, "agent-alpha2")
    [job_id] = dispatcher.client.submit([job_doc(cpu="1")])
    command = agent.next("command")
    agent.send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
    agent.status(1, job_id, command.dispatch.attempt, "RUNNING")
    assert admin.revoke_token(token_id)["revokedAt"]
    started = time.monotonic()
    agent.send(status=agents_pb2.StatusReport(seq=2, status=agents_pb2.AttemptStatus(
        job_id=job_id, attempt=command.dispatch.attempt, state="SUCCEEDED")))
    _ends_unauthenticated(agent, started)
    time.sleep(0.5)
    assert dispatcher.client.get(job_id)["state"] == "RUNNING"  # the report after the revocation was not applied
    again = ScriptedAgent(replicas[where].address, secret, "alpha")
    with pytest.raises(grpc.RpcError) as err:
        again.next("welcome")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    agent.close()
    again.close()


@pytest.mark.parametrize("where", ["same", "other"])
def test_a_revoked_agent_token_ends_its_quiet_link(replicas, where):
    """A link that sends nothing is ended by the revocation itself: open links are not polled every second."""
    admin, token_id, _, agent = _agent_of_alpha(replicas, where, "agent-alpha3")
    assert admin.revoke_token(token_id)["revokedAt"]
    _ends_unauthenticated(agent, time.monotonic())
    agent.close()


@pytest.mark.parametrize("rpc", ["WatchBatches", "Watch"])
@pytest.mark.parametrize("where", ["same", "other"])
def test_a_revoked_users_watch_ends(replicas, where, rpc):
    dispatcher = replicas["same"]
    admin = AdminClient(plaintext(dispatcher.address, dispatcher.admin))
    token_id, secret = _token(admin, "user", "erin")
    channel = grpc.insecure_channel(replicas[where].address)
    call = getattr(jobs_pb2_grpc.JobsStub(channel), rpc)(
        jobs_pb2.WatchRequest(), metadata=[("authorization", f"Bearer {secret}")], timeout=30)
    with Client(plaintext(dispatcher.address, secret, timeout_s=10)) as user:
        user.submit([job_doc()])
    assert next(call) is not None  # the submit's event: the stream is open and delivering
    admin.revoke_token(token_id)
    started = time.monotonic()
    ended = []

    def drain():
        try:
            for _ in call:  # events after the revocation may still arrive until it ends
                pass
        except grpc.RpcError as exc:
            ended.append((exc.code(), exc.details(), time.monotonic()))
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    reader.join(BOUND_S + 5)
    assert ended and ended[0][:2] == (grpc.StatusCode.UNAUTHENTICATED, "invalid, expired or revoked token"), ended
    assert ended[0][2] - started < BOUND_S
    channel.close()


def test_an_expired_token_is_refused_at_once_and_ends_its_watch(dispatcher):
    admin = AdminClient(plaintext(dispatcher.address, dispatcher.admin))
    _, secret = _token(admin, "user", "frank", expires_s=2)
    made = time.monotonic()
    user = Client(plaintext(dispatcher.address, secret, timeout_s=10))
    events = user.watch()
    user.submit([job_doc()])
    assert next(events)["to"] == "QUEUED"
    while time.monotonic() - made < 1.5:  # kept in the cache, as a busy client would
        user.list()
        time.sleep(0.1)
    ended = []

    def drain():
        try:
            for _ in events:
                pass
        except ClientError as exc:
            ended.append((exc, time.monotonic()))
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    time.sleep(max(0.0, made + 2.6 - time.monotonic()))
    assert _refused(user.list, "UNAUTHENTICATED") == "invalid, expired or revoked token"
    reader.join(BOUND_S + 5)
    assert ended and ended[0][0].code == "UNAUTHENTICATED"
    assert ended[0][1] - made < 2 + BOUND_S
    user.close()


def test_a_report_is_checked_against_the_token_row_itself(dispatcher):
    # A revocation whose NOTIFY has not arrived yet (written here without one, the cache still holding the
    # token): the report's own transaction reads the row, so it is not applied.
    from sqlalchemy import func, update

    from dispatcher.store.models import ApiToken
    admin = AdminClient(plaintext(dispatcher.address, dispatcher.admin))
    token_id, secret = _token(admin, "agent", "agent-alpha3", cluster="alpha")
    agent = ScriptedAgent(dispatcher.address, secret, "alpha")
    agent.next("welcome")
    [job_id] = dispatcher.client.submit([job_doc(cpu="1")])
    command = agent.next("command")
    agent.send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
    agent.status(1, job_id, command.dispatch.attempt, "RUNNING")
    with dispatcher.sessions.begin() as session:
        session.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=func.now()))
    agent.send(status=agents_pb2.StatusReport(seq=2, status=agents_pb2.AttemptStatus(
        job_id=job_id, attempt=command.dispatch.attempt, state="SUCCEEDED")))
    with pytest.raises(grpc.RpcError) as err:
        agent.next("status_ack", timeout=BOUND_S + 5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert dispatcher.client.get(job_id)["state"] == "RUNNING"
    agent.close()
