"""No internals in errors: what a raw gRPC call can send to a real dispatcher on loopback is answered with a
proper status and a message written for people, never UNKNOWN with the exception's text (SQL included).

An unexpected exception in any handler, unary or streaming, ends the call with INTERNAL and a short error
id, and the dispatcher's log holds that id with the traceback (dispatcher/api/errors.py, `translated`).
"""
from __future__ import annotations

import json
import logging
import re
import time
from concurrent import futures
from functools import partial

import grpc
import pytest

from dispatcher.api.admin import AdminService
from dispatcher.api.agents import AgentsService
from dispatcher.api.errors import translated
from dispatcher.api.jobs import JobsService
from dispatcher.errors import InvalidRequest
from sluice import transport
from sluice.v1 import admin_pb2, admin_pb2_grpc, agents_pb2, agents_pb2_grpc, jobs_pb2, jobs_pb2_grpc

INTERNALS = re.compile(r"Traceback|Exception calling application|Error\b|psycopg|sqlalchemy|SELECT|INSERT|UPDATE "
                       r"|\[SQL|\[parameters|bigint|Python int|recursion", re.I)
ERROR_ID = re.compile(r"^internal error ([0-9a-f]{8}): the dispatcher's log has the details$")


def job_json(name: str = "x") -> str:
    return json.dumps({"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name},
                       "spec": {"queue": "default", "podSets": [{"name": "w", "count": 1, "template": {
                           "spec": {"containers": [{"name": "m", "image": "x"}]}}}]}})


DEEP = "[" * 1000 + "]" * 1000


@pytest.fixture
def stubs(system):
    channel = transport.channel(system.dispatcher.address, system.tls)
    metadata = [("authorization", f"Bearer {system.admin_token}")]
    yield jobs_pb2_grpc.JobsStub(channel), admin_pb2_grpc.AdminStub(channel), metadata
    channel.close()


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, (str, bytes)):
            list(result)  # a stream fails as it is read
    return caught.value


def test_the_red_team_raw_calls_are_invalid_arguments_in_words(stubs):
    jobs, admin, md = stubs
    cases = [
        (lambda: jobs.List(jobs_pb2.ListJobsRequest(page_token=str(2 ** 64 + 1)), metadata=md),
         "page_token: not a token from a previous List"),
        # the one that answered with its SQL statement: past int64, Postgres refused the bound id
        (lambda: jobs.List(jobs_pb2.ListJobsRequest(page_token=str(2 ** 63)), metadata=md),
         "page_token: not a token from a previous List"),
        (lambda: jobs.Submit(jobs_pb2.SubmitRequest(specs_json=[DEEP]), metadata=md),
         "document 1: nested deeper than 100 levels"),
        (lambda: jobs.Submit(jobs_pb2.SubmitRequest(specs_json=[job_json()[:-1] + f', "x": {DEEP}}}']), metadata=md),
         "document 1: nested deeper than 100 levels"),
        (lambda: admin.Apply(admin_pb2.ApplyRequest(documents_json=[DEEP]), metadata=md),
         "document 1: nested deeper than 100 levels"),
        (lambda: jobs.Submit(jobs_pb2.SubmitRequest(specs_json=[job_json().replace('"x"', '"\\ud800"', 1)]),
                             metadata=md),
         "document 1: metadata.name: contains a lone surrogate (a \\ud800-\\udfff escape not in a pair): "
         "not Unicode text"),
        (lambda: admin.Apply(admin_pb2.ApplyRequest(documents_json=[json.dumps({
            "apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": "c", "labels": {"\ud800": "x"}},
            "spec": {"tier": "onprem"}})]), metadata=md),
         "document 1: metadata.labels.\\ud800: contains a lone surrogate (a \\ud800-\\udfff escape not in a pair): "
         "not Unicode text"),
        (lambda: jobs.Usage(jobs_pb2.UsageRequest(since_seconds=1e300), metadata=md),
         "since_seconds: must be a number of seconds from 0 (all time) to 3153600000 (100 years)"),
        (lambda: admin.CreateToken(admin_pb2.CreateTokenRequest(role="user", subject="u", expires_seconds=2 ** 62),
                                   metadata=md),
         "expires_seconds: must be from 0 (never) to 3153600000 (100 years)"),
        (lambda: jobs.SubmitStream(iter([jobs_pb2.SubmitRequest(specs_json=[DEEP])]), metadata=md),
         "document 1: nested deeper than 100 levels"),
    ]
    for call, message in cases:
        err = refused(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert not jobs.List(jobs_pb2.ListJobsRequest(), metadata=md).jobs  # nothing was created


def test_a_nul_in_any_string_of_a_request_is_refused_in_words(stubs):
    jobs, admin, md = stubs
    nul = "a\x00b"
    cases = [
        (lambda: admin.AddMember(admin_pb2.AddMemberRequest(queue="default", user=nul), metadata=md), "user"),
        (lambda: admin.CreateToken(admin_pb2.CreateTokenRequest(role="user", subject=nul), metadata=md), "subject"),
        (lambda: admin.SetClusterState(admin_pb2.SetClusterStateRequest(name=nul, state="cordoned"), metadata=md),
         "name"),
        (lambda: admin.GetObjects(admin_pb2.GetObjectsRequest(kind="queue", name=nul), metadata=md), "name"),
        (lambda: admin.SetQuota(admin_pb2.SetQuotaRequest(queue="default", max={nul: "1"}), metadata=md),
         "max['a\\x00b']"),
        (lambda: jobs.List(jobs_pb2.ListJobsRequest(queue=nul), metadata=md), "queue"),
        (lambda: jobs.Submit(jobs_pb2.SubmitRequest(specs_json=[job_json(), nul]), metadata=md), "specs_json[1]"),
        (lambda: jobs.SubmitStream(iter([jobs_pb2.SubmitRequest(specs_json=[nul])]), metadata=md), "specs_json[0]"),
    ]
    for call, field in cases:
        err = refused(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                               f"{field}: contains a NUL character (\\u0000)")
    assert not jobs.List(jobs_pb2.ListJobsRequest(), metadata=md).jobs


def test_streams_end_with_their_status_not_unknown(stubs, system):
    jobs, _, md = stubs
    wrong = [("authorization", "Bearer sl_nobody")]
    for call in (lambda: jobs.Watch(jobs_pb2.WatchRequest(), metadata=wrong),
                 lambda: jobs.WatchBatches(jobs_pb2.WatchRequest(), metadata=wrong),
                 lambda: jobs.SubmitStream(iter([jobs_pb2.SubmitRequest(specs_json=[job_json()])]), metadata=wrong)):
        err = refused(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.UNAUTHENTICATED, "invalid, expired or revoked token")
    channel = transport.channel(system.dispatcher.address, system.tls)
    try:
        agents = agents_pb2_grpc.AgentsStub(channel)
        hello = agents_pb2.AgentMessage(hello=agents_pb2.Hello(cluster="no-such-cluster"))
        err = refused(lambda: agents.Connect(iter([hello]), metadata=md))
        assert err.code() == grpc.StatusCode.NOT_FOUND and not INTERNALS.search(err.details()), err.details()
        heartbeat = agents_pb2.AgentMessage(heartbeat=agents_pb2.Heartbeat())
        err = refused(lambda: agents.Connect(iter([heartbeat]), metadata=md))
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                               "connect: the first message must be a hello")
        # A capacity Postgres cannot store, in the hello and later on the link (read by the stream's reader
        # thread: its failure ends the stream too, as any handler's does, where it once ended it OK, unexplained).
        nul = agents_pb2.Capacity(allocatable=jobs_pb2.Resources(milli={"a\x00b": 1}))
        bad_hello = agents_pb2.AgentMessage(hello=agents_pb2.Hello(cluster="onprem", capacity=nul))
        bad_heartbeat = agents_pb2.AgentMessage(heartbeat=agents_pb2.Heartbeat(capacity=nul))
        good_hello = agents_pb2.AgentMessage(hello=agents_pb2.Hello(cluster="onprem"))
        for messages in ([bad_hello], [good_hello, bad_heartbeat]):
            err = refused(partial(agents.Connect, _held_open(messages), metadata=md, timeout=10))
            assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                   "capacity: a resource name contains a NUL character (\\u0000)")
    finally:
        channel.close()


def _held_open(messages: list):
    """The messages, then a pause with the stream still open (an agent's link does not end by itself)."""
    yield from messages
    time.sleep(5)


class _Broken(jobs_pb2_grpc.JobsServicer):
    """Handlers that fail as a bug would, with text that must not reach a client."""

    @translated
    def Get(self, request, context):
        raise RuntimeError("SELECT secret FROM api_tokens")

    @translated
    def List(self, request, context):
        raise InvalidRequest("queue: '\ud800x' is not a valid name")  # words that quote a lone surrogate

    @translated
    def Watch(self, request, context):
        yield jobs_pb2.JobEvent(id=1)
        raise KeyError("psycopg.errors.Whatever: password=hunter2")


@pytest.fixture
def broken_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    jobs_pb2_grpc.add_JobsServicer_to_server(_Broken(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield jobs_pb2_grpc.JobsStub(channel)
    channel.close()
    server.stop(None)


def test_an_unexpected_exception_is_internal_with_an_error_id_the_log_holds(broken_server, caplog):
    caplog.set_level(logging.ERROR, logger="dispatcher.api.errors")
    unary = refused(lambda: broken_server.Get(jobs_pb2.GetJobRequest(id=1)))
    stream = broken_server.Watch(jobs_pb2.WatchRequest())
    assert next(stream).id == 1
    streaming = refused(lambda: list(stream))
    for err, text in ((unary, "SELECT secret FROM api_tokens"), (streaming, "password=hunter2")):
        assert err.code() == grpc.StatusCode.INTERNAL
        found = ERROR_ID.match(err.details())
        assert found, err.details()
        records = [r for r in caplog.records if found[1] in r.getMessage()]
        assert len(records) == 1 and records[0].exc_info is not None
        assert text in caplog.text  # the traceback, with the exception's own words, is in the log only
    assert ERROR_ID.match(unary.details())[1] != ERROR_ID.match(streaming.details())[1]


def test_words_quoting_a_lone_surrogate_reach_the_client_escaped(broken_server):
    err = refused(lambda: broken_server.List(jobs_pb2.ListJobsRequest()))
    assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "queue: '\\ud800x' is not a valid name")


@pytest.mark.parametrize("service, base", [(JobsService, jobs_pb2_grpc.JobsServicer),
                                           (AdminService, admin_pb2_grpc.AdminServicer),
                                           (AgentsService, agents_pb2_grpc.AgentsServicer)])
def test_every_handler_is_translated(service, base):
    names = [n for n in vars(base) if n[0].isupper()]
    assert names
    for name in names:
        assert getattr(service, name).__code__.co_qualname.startswith("translated.<locals>."), name
