"""Submit over a stream (Jobs.SubmitStream, sluice.client's _SubmitStream): a real dispatcher, gRPC over
loopback and Postgres. A client that submits again sends on one stream; every answer is the one a Submit
call gives (the ids after the commit, or the same error), and whatever keeps a stream from being used
(none free on the server, a server without them, a deadline, a revoked token, a server gone) ends with
the request answered by a call or with the call's error, never sent twice."""
from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import psycopg
import pytest

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import clusters as cluster_store
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice import client as client_module
from sluice.admin_client import AdminClient
from sluice.client import Client, ClientError
from sluice.config import ClientConfig
from sluice.objects import default_objects
from sluice.v1 import jobs_pb2, jobs_pb2_grpc
from tests.integration.test_spine import job_doc


def _start(db_url: str, port: int = 0, **settings) -> Dispatcher:
    d = Dispatcher(ServerSettings(listen=f"127.0.0.1:{port}", metrics_listen=None, schedule=False,
                                  database=DatabaseSettings(url=db_url), **settings)).start()
    with d.sessions.begin() as session:
        if not cluster_store.list_queues(session):
            cluster_store.apply_objects(session, default_objects())
        d.token = tokens.create(session, "admin", "root")
    return d


@pytest.fixture
def serve(db_url):
    started = []

    def start(**settings) -> Dispatcher:
        started.append(_start(db_url, **settings))
        return started[-1]
    yield start
    for d in started:
        d.stop(0)


@pytest.fixture
def clients():
    made = []

    def make(d: Dispatcher, timeout_s: float = 30, token: str | None = None) -> Client:
        made.append(Client(ClientConfig(d.address, token or d.token, timeout_s=timeout_s, insecure=True)))
        return made[-1]
    yield make
    for c in made:
        c.close()


def _jobs(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url.replace("postgresql+psycopg", "postgresql")) as conn:
        return conn.execute("SELECT id, name FROM jobs ORDER BY id").fetchall()


def _refusal(call) -> ClientError:
    with pytest.raises(ClientError) as err:
        call()
    return err.value


def test_a_client_that_submits_again_sends_on_one_stream_and_each_job_is_written_once(serve, clients, db_url):
    c = clients(serve())
    first = c.submit([job_doc(name="j0")])
    assert c._stream is None  # one submit: a call, no stream
    ids = [c.submit([job_doc(name=f"j{n}")])[0] for n in range(1, 21)]
    stream = c._stream
    assert stream is not None and stream.usable(time.monotonic())
    ids += c.submit([job_doc(name=f"b{n}") for n in range(5)])  # a batch on the same stream
    assert c._stream is stream
    assert first + ids == sorted(first + ids) and len(set(first + ids)) == 26
    assert _jobs(db_url) == list(zip(first + ids, ["j0", *(f"j{n}" for n in range(1, 21)),
                                                  *(f"b{n}" for n in range(5))]))


def test_streams_submitting_at_once_each_get_their_own_answer(serve, db_url):
    """Submits from many streams at once are written in shared groups: each request is answered with its own
    ids, a refused one ends its own stream only, and a key sent on two streams at once commits once."""
    d = serve()
    good = client_module._encode(job_doc(name="good"))
    lost = client_module._encode({**job_doc(name="lost"), "spec": {**job_doc()["spec"], "queue": "nowhere"}})
    channel = grpc.insecure_channel(d.address)
    stub, root = jobs_pb2_grpc.JobsStub(channel), [("authorization", f"Bearer {d.token}")]
    answers: dict[int, list] = {}

    def stream(n: int) -> None:
        requests = [jobs_pb2.SubmitRequest(specs_json=[good] * (1 + i % 3)) for i in range(10)]
        requests.append(jobs_pb2.SubmitRequest(specs_json=[good], idempotency_key=f"k{n % 2}"))
        if n % 4 == 3:
            requests.append(jobs_pb2.SubmitRequest(specs_json=[lost]))
        got = answers.setdefault(n, [])
        try:
            for response in stub.SubmitStream(iter(requests), metadata=root):
                got.append(list(response.ids))
        except grpc.RpcError as exc:
            got.append((exc.code(), exc.details()))
    try:
        threads = [threading.Thread(target=stream, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        channel.close()
    ids = []
    for n, got in sorted(answers.items()):
        sizes = [1 + i % 3 for i in range(10)] + [1]
        assert [len(a) for a in got[:11]] == sizes, (n, got)
        if n % 4 == 3:
            assert got[11] == (grpc.StatusCode.NOT_FOUND, "job: spec.queue: queue 'nowhere' not found")
        else:
            assert len(got) == 11
        ids += [i for a in got[:10] for i in a]
    keyed = {n % 2: tuple(got[10]) for n, got in answers.items()}
    assert all(tuple(answers[n][10]) == keyed[n % 2] for n in answers)  # one commit per key
    assert len(ids) == len(set(ids)) == 16 * 19
    assert len(_jobs(db_url)) == 16 * 19 + 2


@pytest.mark.parametrize("doc, code", [
    ({**job_doc(name="lost"), "spec": {**job_doc()["spec"], "queue": "nowhere"}}, "NOT_FOUND"),
    ({**job_doc(name="bad"), "spec": {**job_doc()["spec"], "priority": "high"}}, "INVALID_ARGUMENT"),
])
def test_a_refused_request_on_the_stream_fails_as_a_call_does_and_the_next_goes_on_a_new_stream(
        serve, clients, db_url, doc, code):
    d = serve()
    by_call = _refusal(lambda: clients(d).submit([doc]))  # a new client's first submit: a call
    c = clients(d)
    c.submit([job_doc(name="a")])
    c.submit([job_doc(name="b")])
    stream = c._stream
    assert stream is not None
    on_stream = _refusal(lambda: c.submit([doc]))
    assert (on_stream.code, on_stream.message) == (by_call.code, by_call.message) and on_stream.code == code
    assert [name for _, name in _jobs(db_url)] == ["a", "b"]
    c.submit([job_doc(name="c")])
    assert c._stream is not None and c._stream is not stream
    assert [name for _, name in _jobs(db_url)] == ["a", "b", "c"]


def test_with_every_stream_taken_a_client_submits_by_calls(serve, clients, db_url):
    d = serve(submit_streams=1)
    a, b = clients(d), clients(d)
    for n in range(3):
        a.submit([job_doc(name=f"a{n}")])
    assert a._stream is not None
    for n in range(3):
        b.submit([job_doc(name=f"b{n}")])
    assert b._stream is None and b._streams_from > time.monotonic()  # refused: calls for a while
    assert sorted(name for _, name in _jobs(db_url)) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    a.close()  # its stream ends and frees the server's place
    c = clients(d)
    deadline = time.monotonic() + 5
    while c._stream is None and time.monotonic() < deadline:
        c.submit([job_doc(name="c")])
    assert c._stream is not None


def test_a_dispatcher_allowing_no_streams_is_sent_calls(serve, clients, db_url):
    c = clients(serve(submit_streams=0))
    for n in range(3):
        c.submit([job_doc(name=f"j{n}")])
    assert c._stream is None
    assert len(_jobs(db_url)) == 3


def test_a_dispatcher_without_submit_streams_is_sent_calls_from_then_on():
    """An older dispatcher: Jobs without SubmitStream (the generated servicer answers UNIMPLEMENTED)."""
    calls = []

    class Older(jobs_pb2_grpc.JobsServicer):
        def Submit(self, request, context):
            calls.append(len(request.specs_json))
            return jobs_pb2.SubmitResponse(ids=[len(calls)])

    server = grpc.server(futures.ThreadPoolExecutor(4))
    jobs_pb2_grpc.add_JobsServicer_to_server(Older(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client(ClientConfig(f"127.0.0.1:{port}", "t", timeout_s=10, insecure=True)) as c:
            assert [c.submit([job_doc()])[0] for _ in range(4)] == [1, 2, 3, 4]
            assert c._stream is None and c._streams_from == float("inf")
        assert calls == [1, 1, 1, 1]
    finally:
        server.stop(0)


def test_an_overdue_request_on_the_stream_fails_with_deadline_exceeded(serve, clients, db_url):
    d = serve()
    c = clients(d, timeout_s=1.0)
    c.submit([job_doc(name="a")])
    c.submit([job_doc(name="b")])
    stream = c._stream
    with psycopg.connect(db_url.replace("postgresql+psycopg", "postgresql")) as locker:
        locker.execute("LOCK TABLE jobs IN SHARE MODE")  # inserts wait
        began = time.monotonic()
        late = _refusal(lambda: c.submit([job_doc(name="late")]))
        waited = time.monotonic() - began
    assert late.code == "DEADLINE_EXCEEDED"
    assert 0.9 <= waited < 1.0 + 5 * client_module._Watchdog.TICK_S
    c.submit([job_doc(name="after")])
    assert c._stream is not None and c._stream is not stream
    # As with a call, the request that timed out was still taken: it is written once, after the lock.
    assert sorted(name for _, name in _jobs(db_url)) == ["a", "after", "b", "late"]


def test_a_token_revoked_while_its_stream_is_open_is_refused_on_it(serve, clients, db_url):
    d = serve()
    admin = AdminClient(ClientConfig(d.address, d.token, timeout_s=10, insecure=True))
    token = admin.create_token("user", "alice")
    c = clients(d, token=token["secret"])
    c.submit([job_doc(name="a")])
    c.submit([job_doc(name="b")])
    assert c._stream is not None
    admin.revoke_token(token["id"])
    admin.close()
    refused = _refusal(lambda: c.submit([job_doc(name="c")]))
    assert refused.code == "UNAUTHENTICATED"
    assert [name for _, name in _jobs(db_url)] == ["a", "b"]


def test_a_stream_ended_by_a_dispatcher_going_away_is_replaced_without_an_error(db_url, clients):
    d = _start(db_url)
    port = d.port
    c = clients(d)
    c.submit([job_doc(name="a")])
    c.submit([job_doc(name="b")])
    old = c._stream
    d.stop(0)
    d = _start(db_url, port=port)
    try:
        deadline = time.monotonic() + 5
        while old.usable(time.monotonic()) and time.monotonic() < deadline:
            time.sleep(0.05)
        c._metadata = [("authorization", f"Bearer {d.token}")]  # the same database: the old token still works too
        c.submit([job_doc(name="c")])
        assert c._stream is not None and c._stream is not old
    finally:
        d.stop(0)
    assert [name for _, name in _jobs(db_url)] == ["a", "b", "c"]


def test_threads_sharing_a_client_each_get_their_own_ids(serve, clients, db_url):
    c = clients(serve())
    c.submit([job_doc(name="first")])
    got: list[int] = []
    lock = threading.Lock()

    def submit(n: int) -> None:
        for m in range(25):
            ids = c.submit([job_doc(name=f"t{n}-{m}")])
            with lock:
                got.extend(ids)
    threads = [threading.Thread(target=submit, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 100
    assert len(_jobs(db_url)) == 101


def test_the_watchdog_thread_ends_once_the_clients_streams_are_closed(serve, clients):
    c = clients(serve())
    c.submit([job_doc()])
    c.submit([job_doc()])
    assert any(t.name == "sluice-submit-watchdog" for t in threading.enumerate())
    c.close()
    deadline = time.monotonic() + 5
    while any(t.name == "sluice-submit-watchdog" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "sluice-submit-watchdog" for t in threading.enumerate())
