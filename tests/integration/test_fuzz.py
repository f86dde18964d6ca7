"""Fuzzing the gRPC surface: generated messages and documents, valid and broken, sent to a real dispatcher on
loopback (real PostgreSQL, the default clusters, queues and classes, no agents, no scheduling replica).

For every call of the Jobs, Admin and Agents services, and for job files and admin objects (valid ones,
mutated at random, and broken JSON text), it asserts that
- no call ends UNKNOWN or INTERNAL (an unexpected exception in a handler: a bug, whatever its error id says);
- no error text holds SQL or a Python exception's name (Traceback, Error:, psycopg, sqlalchemy, SELECT...);
- a refused call changes nothing: the row counts of the main tables are the same before and after.

The suite runs a small number of examples per property (FUZZ_EXAMPLES, under about 30 s in all). For a longer
hunt set SLUICE_FUZZ_EXAMPLES, e.g. `SLUICE_FUZZ_EXAMPLES=5000 python -m pytest -q tests/integration/test_fuzz.py`;
hypothesis prints the smallest failing example it finds.
"""
from __future__ import annotations

import json
import math
import os
import re

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.services import administering
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice.objects import default_objects
from sluice.v1 import admin_pb2, admin_pb2_grpc, agents_pb2, agents_pb2_grpc, jobs_pb2, jobs_pb2_grpc

FUZZ_EXAMPLES = 150  # per property in the suite; SLUICE_FUZZ_EXAMPLES runs more
EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES") or FUZZ_EXAMPLES)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

TABLES = ("jobs", "job_events", "attempts", "outbox", "api_tokens", "admin_audit", "clusters", "queues",
          "service_classes", "burst_policies")
INTERNALS = re.compile(r"Traceback|Exception|Error:|[A-Z][a-z]+Error\b|psycopg|sqlalchemy|\[SQL|\[parameters|"
                       r"\b(SELECT|INSERT|UPDATE|DELETE)\b|Python int|recursion")
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS}
WORDS = ["", "default", "onprem", "cloud", "edge", "batch", "Queue", "queues", "ServiceClass", "Cluster",
         "BurstPolicy", "burstpolicy", "admin", "user", "agent", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "active",
         "cordoned", "draining", "queue", "cluster", "user", "class", "cpu", "memory", "nvidia.com/gpu", "1", "0.5",
         "1Gi", "-1", "1e309", "NaN", "9223372036854775808", "x" * 300, "a\u0000b", "\u00e9", "../..", "sl_x"]


# -- documents --------------------------------------------------------------------------------------
def _job() -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "fuzz", "labels": {"team": "a"}},
            "spec": {"queue": "default", "priority": 0, "maxRetries": 1, "maxRuntime": "1h",
                     "placement": {"tiers": ["onprem"], "clusterSelector": {}},
                     "podSets": [{"name": "w", "count": 2, "template": {
                         "metadata": {"annotations": {"sluice.io/sim-duration": "1s"}},
                         "spec": {"containers": [{"name": "m", "image": "x",
                                                  "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}]}}


def _kubernetes_job() -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "k", "annotations": {"sluice.io/queue": "default"}},
            "spec": {"parallelism": 2, "completions": 2, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "m", "image": "x",
                                                          "resources": {"limits": {"cpu": "500m"}}}]}}}}


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 64 + 1, -(2 ** 63) - 1, 10 ** 400]),
    st.integers(), st.floats(), st.sampled_from(WORDS), st.text(max_size=20),
    st.sampled_from(["\ud800", "a\udfffb", "\u0000"]))  # a lone surrogate, as a JSON \ud800 escape decodes
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)), inner,
                                                 max_size=3)), max_leaves=8)


def _paths(value, here=()) -> list[tuple]:
    out = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, here + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, here + (i,))
    return out


@st.composite
def mutated(draw, base: dict) -> dict:
    """base, with up to three of its values replaced, keys removed or unknown keys added."""
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(JSON_VALUES)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(JSON_VALUES)
    return doc


@st.composite
def document_text(draw, bases: list[dict]) -> str:
    """A JSON document as a client would send it: valid, mutated, or broken text."""
    doc = draw(st.one_of(st.sampled_from(bases), st.sampled_from(bases).flatmap(mutated), JSON_VALUES))
    encoded = json.dumps(doc)  # NaN and Infinity as `json` writes them; lone surrogates as \ud800 escapes
    return draw(st.one_of(
        st.just(encoded), st.just(encoded),
        st.integers(0, len(encoded)).map(lambda n: encoded[:n]),  # cut short
        st.integers(1, 3000).map(lambda n: "[" * n + encoded + "]" * n),  # nested deep
        st.text(max_size=30)))


JOB_TEXTS = document_text([_job(), _kubernetes_job()])
ADMIN_TEXTS = document_text([o.to_document() for o in default_objects()])


# -- messages ---------------------------------------------------------------------------------------
_INTS = {FieldDescriptor.TYPE_INT64: 64, FieldDescriptor.TYPE_SINT64: 64, FieldDescriptor.TYPE_SFIXED64: 64,
         FieldDescriptor.TYPE_INT32: 32, FieldDescriptor.TYPE_SINT32: 32, FieldDescriptor.TYPE_SFIXED32: 32}


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    if field.name in ("specs_json", "spec_json"):
        return JOB_TEXTS
    if field.name in ("documents_json", "document_json"):
        return ADMIN_TEXTS
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
        return st.one_of(st.sampled_from(WORDS), text, text.map(lambda t: t + "\x00"))
    if kind in _INTS:
        bits = _INTS[kind]
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return st.one_of(st.sampled_from([0, 1, 2, 3, -1, lo, hi]), st.integers(lo, hi))
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, (1 << 64) - 1)
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, (1 << 32) - 1)
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.one_of(st.sampled_from([0.0, 1.0, 86400.0, -1.0, 1e300, math.inf, math.nan]), st.floats())
    if kind == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=20)
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    raise AssertionError(f"no strategy for {field.full_name}")


@st.composite
def message(draw, descriptor, depth: int = 0):
    """A message of `descriptor` with some of its fields set, to generated values of their types."""
    from google.protobuf import message_factory
    out = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if field.message_type is not None and depth >= 3:
            continue
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            getattr(out, field.name).update(draw(st.dictionaries(_scalar(key), _scalar(value), max_size=3)))
        elif field.message_type is not None:
            items = draw(st.lists(message(field.message_type, depth + 1), min_size=1,
                                  max_size=3 if field.is_repeated else 1))
            if field.is_repeated:
                getattr(out, field.name).extend(items)
            else:
                getattr(out, field.name).CopyFrom(items[0])
        elif field.is_repeated:
            getattr(out, field.name).extend(draw(st.lists(_scalar(field), max_size=3)))
        else:
            setattr(out, field.name, draw(_scalar(field)))
    return out


# -- the dispatcher and the checks -------------------------------------------------------------------
@pytest.fixture
def target(db_url):
    """A dispatcher with the default objects and tokens of each role, and stubs of its three services."""
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url), schedule=False,
                                  metrics_listen=None)).start()
    with d.sessions.begin() as session:
        administering.apply(session, "fuzz", default_objects())
        secrets = {"admin": tokens.create(session, "admin", "root"), "user": tokens.create(session, "user", "ann"),
                   "agent": tokens.create(session, "agent", "agent-onprem", "onprem"), "none": "sl_nobody"}
    channel = grpc.insecure_channel(d.address)
    d.fuzz = {"jobs": jobs_pb2_grpc.JobsStub(channel), "admin": admin_pb2_grpc.AdminStub(channel),
              "agents": agents_pb2_grpc.AgentsStub(channel), "secrets": secrets}
    yield d
    channel.close()
    d.stop()


def _counts(d) -> dict[str, int]:
    with d.sessions() as session:
        return {t: session.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


def _check(d, call) -> None:
    """Run call(); a refusal must be a proper status, in words, with nothing changed."""
    before = _counts(d)
    try:
        call()
        return
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (code, details)
    assert not INTERNALS.search(details), (code, details)
    if code in REFUSALS:
        assert _counts(d) == before, (code, details)
    else:  # a stream read until its deadline: it was taken, not refused
        assert code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED), (code, details)


def _methods(service) -> list[tuple[str, object, object, bool, bool]]:
    """(name, input descriptor, output, client streams, server streams) of each method of a service."""
    return [(m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
            for m in service.methods]


CALLS = [("jobs", m) for m in _methods(jobs_pb2.DESCRIPTOR.services_by_name["Jobs"])]
CALLS += [("admin", m) for m in _methods(admin_pb2.DESCRIPTOR.services_by_name["Admin"])]
CALLS += [("agents", m) for m in _methods(agents_pb2.DESCRIPTOR.services_by_name["Agents"])]


def _hello(hello: agents_pb2.Hello, cluster: str) -> agents_pb2.AgentMessage:
    hello.cluster = cluster
    return agents_pb2.AgentMessage(hello=hello)


@st.composite
def calls(draw):
    stub, (name, request, _, client_streams, server_streams) = draw(st.sampled_from(CALLS))
    role = draw(st.sampled_from(["admin", "admin", "admin", "user", "agent", "none"]))
    if client_streams:
        if request.name == "AgentMessage":  # mostly a hello first: the rest of the link is reached only so
            hello = st.builds(_hello, message(agents_pb2.Hello.DESCRIPTOR),
                              st.sampled_from(["onprem", "cloud", "edge", "nowhere"]))
            first = draw(st.one_of(hello, hello, message(request)))
            payload = [first] + draw(st.lists(message(request), max_size=4))
        else:
            payload = draw(st.lists(message(request), min_size=1, max_size=1))
    else:
        payload = draw(message(request))
    return stub, name, payload, role, client_streams, server_streams


@FUZZ
@given(call=calls())
def test_no_message_gets_an_unknown_error_internals_or_a_half_write(target, call):
    stub, name, payload, role, client_streams, server_streams = call
    method = getattr(target.fuzz[stub], name)
    metadata = [("authorization", f"Bearer {target.fuzz['secrets'][role]}")]
    request = iter(payload) if client_streams else payload

    def run():
        if server_streams:
            for _ in method(request, metadata=metadata, timeout=0.5):
                pass
        else:
            method(request, metadata=metadata, timeout=10)
    _check(target, run)


@FUZZ
@given(specs=st.lists(JOB_TEXTS, min_size=1, max_size=3), stream=st.booleans())
def test_no_job_file_gets_an_unknown_error_internals_or_a_half_write(target, specs, stream):
    jobs, md = target.fuzz["jobs"], [("authorization", f"Bearer {target.fuzz['secrets']['user']}")]
    request = jobs_pb2.SubmitRequest(specs_json=specs)
    if stream:
        _check(target, lambda: list(jobs.SubmitStream(iter([request]), metadata=md, timeout=10)))
    else:
        _check(target, lambda: jobs.Submit(request, metadata=md, timeout=10))


@FUZZ
@given(documents=st.lists(ADMIN_TEXTS, min_size=1, max_size=3), dry_run=st.booleans())
def test_no_admin_object_gets_an_unknown_error_internals_or_a_half_write(target, documents, dry_run):
    admin, md = target.fuzz["admin"], [("authorization", f"Bearer {target.fuzz['secrets']['admin']}")]
    _check(target, lambda: admin.Apply(admin_pb2.ApplyRequest(documents_json=documents, dry_run=dry_run),
                                       metadata=md, timeout=10))
