"""A submit is all or nothing, whatever its size, and a retry never duplicates it: a real dispatcher, gRPC
over loopback and Postgres. The client sends a file of more than one request's documents as the parts of
one submit on one stream (or as one call), committed with its last part; every submit carries an
idempotency key, per user, that answers a repeat with the ids of the submit that committed."""
from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from dispatcher.store import tokens
from sluice import client as client_module
from sluice.v1 import jobs_pb2, jobs_pb2_grpc
from tests.integration.test_spine import job_doc
from tests.integration.test_submit_stream import _jobs, _refusal, _start, clients, serve  # noqa: F401


def _file(n: int, bad_at: int | None = None) -> list[dict]:
    return [job_doc(name=f"j{i}", **({"queue": "nowhere"} if i == bad_at else {})) for i in range(1, n + 1)]


def test_a_file_whose_last_document_is_refused_commits_nothing_and_names_its_place_in_the_file(
        serve, clients, db_url):
    c = clients(serve())
    err = _refusal(lambda: c.submit(_file(1500, bad_at=1500)))
    assert err.code == "NOT_FOUND"
    assert err.message == "document 1500: spec.queue: queue 'nowhere' not found", err.message
    assert _jobs(db_url) == []  # not the first 1,000
    ids = c.submit(_file(1500))
    assert len(ids) == 1500 and [name for _, name in _jobs(db_url)] == [f"j{i}" for i in range(1, 1501)]
    assert [i for i, _ in _jobs(db_url)] == ids


def test_a_refused_document_in_an_early_part_names_its_place_in_the_file(serve, clients, db_url):
    c = clients(serve())
    docs = _file(2500)
    docs[1234]["spec"]["priority"] = "high"
    err = _refusal(lambda: c.submit(docs))
    assert err.code == "INVALID_ARGUMENT" and err.message.startswith("document 1235: spec.priority"), err.message
    assert _jobs(db_url) == []


def test_without_a_free_stream_a_large_file_goes_as_one_call_all_or_nothing(serve, clients, db_url):
    c = clients(serve(submit_streams=0))
    err = _refusal(lambda: c.submit(_file(1500, bad_at=1500)))
    assert err.message == "document 1500: spec.queue: queue 'nowhere' not found", err.message
    assert _jobs(db_url) == []
    assert len(c.submit(_file(1500))) == 1500 and len(_jobs(db_url)) == 1500


def _raw(d, token):
    channel = grpc.insecure_channel(d.address)
    return channel, jobs_pb2_grpc.JobsStub(channel), [("authorization", f"Bearer {token}")]


def test_the_same_key_answers_the_ids_it_committed_and_creates_nothing_more(serve, db_url):
    d = serve()
    with d.sessions.begin() as session:
        other = tokens.create(session, "user", "bob")
    channel, stub, root = _raw(d, d.token)
    docs = [client_module._encode(doc) for doc in _file(3)]
    try:
        first = stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key="k-1"), metadata=root)
        again = stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key="k-1"), metadata=root)
        assert list(again.ids) == list(first.ids) and not first.replayed and again.replayed
        assert len(_jobs(db_url)) == 3
        # A key is the user's own: another user's same key is another submit.
        bobs = stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key="k-1"),
                           metadata=[("authorization", f"Bearer {other}")])
        assert set(bobs.ids).isdisjoint(first.ids) and len(_jobs(db_url)) == 6
        # The same key with other documents is refused, not answered with the first submit's ids.
        with pytest.raises(grpc.RpcError) as err:
            stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs[:2], idempotency_key="k-1"), metadata=root)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "k-1" in err.value.details() and "other documents" in err.value.details()
        assert len(_jobs(db_url)) == 6
    finally:
        channel.close()


def test_many_calls_with_the_same_key_at_once_commit_one_submit(serve, db_url):
    """Calls gathered into one write (group commit), the same key twice among them: one commits, the other
    answers its ids."""
    d = serve()
    channel, stub, root = _raw(d, d.token)
    docs = [client_module._encode(doc) for doc in _file(2)]
    answers: list = []
    try:
        def call(key: str) -> None:
            answers.append((key, list(stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key=key),
                                                  metadata=root).ids)))
        threads = [threading.Thread(target=call, args=(f"k{n % 4}",)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        by_key: dict[str, set] = {}
        for key, ids in answers:
            by_key.setdefault(key, set()).add(tuple(ids))
        assert len(answers) == 16 and all(len(v) == 1 for v in by_key.values()), by_key
        assert len(_jobs(db_url)) == 8
    finally:
        channel.close()


def test_more_is_refused_on_a_submit_call(serve, db_url):
    d = serve()
    channel, stub, root = _raw(d, d.token)
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Submit(jobs_pb2.SubmitRequest(specs_json=[client_module._encode(job_doc())], more=True),
                        metadata=root)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "SubmitStream" in err.value.details()
        assert _jobs(db_url) == []
    finally:
        channel.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_client_retries_after_unavailable_with_the_same_key(serve, clients, db_url):
    """The dispatcher is down when the submit starts and comes up a moment later: the client's retry
    submits once."""
    port = _free_port()
    d = serve()  # the database's objects and a token
    token = d.token
    d.stop(0)
    later: list = []
    starter = threading.Timer(1.0, lambda: later.append(_start(db_url, port=port)))
    starter.start()
    from sluice.client import Client
    from sluice.config import ClientConfig
    c = Client(ClientConfig(f"127.0.0.1:{port}", token, timeout_s=30, insecure=True))
    try:
        started = time.monotonic()
        ids = c.submit(_file(1500))
        assert len(ids) == 1500 and len(_jobs(db_url)) == 1500 and time.monotonic() - started >= 0.9
    finally:
        c.close()
        starter.join()
        for server in later:
            server.stop(0)


def test_a_submit_past_the_limit_is_refused_before_anything_is_sent(serve, clients, db_url):
    c = clients(serve())
    err = _refusal(lambda: c.submit([{}] * (client_module.MAX_SUBMIT + 1)))
    assert err.code == "INVALID_ARGUMENT" and str(client_module.MAX_SUBMIT) in err.message.replace(",", "")
    assert _jobs(db_url) == []


def test_keys_are_kept_until_the_retention_then_pruned(serve, db_url):
    from dispatcher.scheduler.settings import SchedulerSettings
    from dispatcher.store import submit_keys
    d = serve()
    channel, stub, root = _raw(d, d.token)
    docs = [client_module._encode(job_doc())]
    try:
        old = stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key="old"), metadata=root).ids
        new = stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key="new"), metadata=root).ids
        retention = SchedulerSettings().submit_key_retention_s
        assert retention == 86_400
        with d.sessions.begin() as session:
            from sqlalchemy import text
            session.execute(text("UPDATE submit_keys SET created_at = now() - make_interval(secs => :s) "
                                 "WHERE key = 'old'"), {"s": retention + 1})
        with d.sessions.begin() as session:
            assert submit_keys.prune(session, retention, 100) == 1
        again = stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key="new"), metadata=root)
        assert again.replayed and list(again.ids) == list(new)
        renewed = stub.Submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key="old"), metadata=root)
        assert not renewed.replayed and list(renewed.ids) != list(old)
    finally:
        channel.close()
