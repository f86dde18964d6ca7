"""The console's JSON API against a real dispatcher and sim agents, over HTTPS on its metrics port: each call
goes through the dispatcher's own gRPC API, so its rules (tokens, scoping, validation) answer as HTTP statuses."""
from __future__ import annotations

import json
import os
import ssl
import stat
import time
import urllib.error
import urllib.request

import pytest

from sluice.admin_client import AdminClient
from tests.integration.test_spine import job_doc, wait_final


def call(system, path: str, *, token: str | None = "admin", method: str = "GET") -> tuple[int, dict | str, dict]:
    """(status, body, headers) of one request; the body parsed when it is JSON."""
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {system.admin_token if token == 'admin' else token}"
    request = urllib.request.Request(f"https://127.0.0.1:{system.dispatcher.metrics_port}{path}", method=method,
                                     headers=headers, data=b"" if method == "POST" else None)
    context = ssl.create_default_context(cafile=system.tls.ca)
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as reply:
            status, body, got = reply.status, reply.read(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        status, body, got = exc.code, exc.read(), dict(exc.headers)
    kind = got.get("Content-Type", "")
    return status, json.loads(body) if kind.startswith("application/json") else body.decode(), got


def ok(system, path: str, **kwargs) -> dict:
    status, body, _ = call(system, path, **kwargs)
    assert status == 200, (path, status, body)
    return body


def wait_state(system, job_id: int, wanted: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = ok(system, f"/api/v1/jobs/{job_id}")
        if job["state"] == wanted:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not {wanted} in {timeout}s: {job['state']} {job['reason']}")


def test_list_filters_and_pages(system):
    ids = system.client.submit([job_doc(name=f"alpha-{n}") for n in range(3)] + [job_doc(name="beta-1")])
    wait_final(system.client, ids)
    listed = ok(system, "/api/v1/jobs")
    assert [j["id"] for j in listed["jobs"]] == ids and listed["nextPageToken"] is None
    assert listed["jobs"][0] == system.client.get(ids[0])  # the same dicts as the Python client and the CLI

    assert [j["id"] for j in ok(system, "/api/v1/jobs?name=ALPHA")["jobs"]] == ids[:3]  # contains, any case
    assert ok(system, "/api/v1/jobs?name=%25")["jobs"] == []  # the text itself, not a pattern
    assert [j["id"] for j in ok(system, "/api/v1/jobs?state=SUCCEEDED&queue=default&user=admin")["jobs"]] == ids
    assert ok(system, "/api/v1/jobs?user=nobody")["jobs"] == []
    assert [j["id"] for j in ok(system, "/api/v1/jobs?cluster=onprem")["jobs"]] == ids
    assert ok(system, "/api/v1/jobs?cluster=cloud")["jobs"] == []

    first = ok(system, "/api/v1/jobs?limit=3")
    assert [j["id"] for j in first["jobs"]] == ids[:3] and first["nextPageToken"]
    second = ok(system, f"/api/v1/jobs?limit=3&page={first['nextPageToken']}")
    assert [j["id"] for j in second["jobs"]] == ids[3:] and second["nextPageToken"] is None


def test_describe_explain_and_cancel(system):
    [done] = system.client.submit([job_doc(name="quick")])
    wait_final(system.client, [done])
    described = ok(system, f"/api/v1/jobs/{done}")
    assert described["state"] == "SUCCEEDED" and described["spec"]["spec"]["podSets"][0]["name"] == "w"
    assert [e["to"] for e in described["events"]] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    explained = ok(system, f"/api/v1/jobs/{done}/explain")
    assert explained["id"] == done and "quota" in explained
    assert {c["cluster"] for c in explained["clusters"]} >= {"onprem"} and explained["bursts"] == []
    logs = ok(system, f"/api/v1/jobs/{done}/logs")
    assert (logs["attempt"], logs["cluster"]) == (1, described["cluster"])
    assert logs["lines"][-1]["pod"] == f"{done}-1-w-0" and logs["lines"][-1]["line"].endswith("exited with code 0")
    assert [line["line"] for line in ok(system, f"/api/v1/jobs/{done}/logs?tail=1")["lines"]] == \
        [logs["lines"][-1]["line"]]
    status, body, _ = call(system, f"/api/v1/jobs/{done}/logs?pod=nope")
    assert status == 404 and "has no pod 'nope'" in body["error"]

    [long] = system.client.submit([job_doc(name="long", duration="600s")])
    wait_state(system, long, "RUNNING")
    cancelled = ok(system, f"/api/v1/jobs/{long}/cancel", method="POST")
    assert [(j["id"], j["state"]) for j in cancelled["jobs"]] == [(long, "CANCELLED")]
    assert system.client.get(long)["state"] == "CANCELLED"


def test_queues_clusters_and_usage(system):
    [job_id] = system.client.submit([job_doc()])
    wait_final(system.client, [job_id])
    queues = ok(system, "/api/v1/queues")["queues"]
    assert queues == system.client.queues() and "default" in {q["name"] for q in queues}
    clusters = {c["name"]: c for c in ok(system, "/api/v1/clusters")["clusters"]}
    assert set(clusters) == {"onprem", "cloud", "edge"}
    assert clusters["cloud"]["price"] and clusters["onprem"]["price"] == {}
    usage = ok(system, "/api/v1/usage?by=queue&since=24h")
    assert usage["by"] == "queue" and [g["group"] for g in usage["groups"]] == ["default"]
    assert usage["groups"][0]["attempts"] == 1 and usage["burst"][0]["policy"] == "cloud-burst"
    assert ok(system, "/api/v1/usage?since=all")["since"] is None


def test_tokens_decide_as_on_grpc(system):
    for token in (None, "sl_not-a-token", ""):
        status, body, headers = call(system, "/api/v1/jobs", token=token)
        assert status == 401 and body["error"], (token, body)
        assert headers["WWW-Authenticate"].startswith("Bearer")
    assert call(system, "/api/v1/jobs/1/cancel", token="sl_nope", method="POST")[0] == 401

    admin = AdminClient(system.client_settings())
    try:
        agent = admin.create_token("agent", "agent-onprem-2", cluster="onprem")["secret"]
        alice = admin.create_token("user", "alice")["secret"]
    finally:
        admin.close()
    status, body, _ = call(system, "/api/v1/queues", token=agent)
    assert status == 403 and "may not call this" in body["error"]

    [job_id] = system.client.submit([job_doc(name="admins", duration="600s")])
    status, body, _ = call(system, f"/api/v1/jobs/{job_id}", token=alice)  # not hers, nor in a queue of hers
    assert status == 404 and str(job_id) in body["error"]
    assert call(system, f"/api/v1/jobs/{job_id}/cancel", token=alice, method="POST")[0] == 404
    assert system.client.get(job_id)["state"] != "CANCELLED"
    assert ok(system, "/api/v1/jobs", token=alice)["jobs"] == []
    assert call(system, "/api/v1/jobs/999999")[0] == 404


@pytest.mark.parametrize(("path", "method", "status", "text"), [
    ("/api/v1/jobs/abc", "GET", 400, "job id 'abc': not a job id"),
    ("/api/v1/jobs/0/explain", "GET", 400, "not a job id"),
    ("/api/v1/jobs/99999999999999999999", "GET", 400, "not a job id"),
    ("/api/v1/jobs?state=DONE", "GET", 400, "state: 'DONE' is not one of"),
    ("/api/v1/jobs?limit=ten", "GET", 400, "limit 'ten'"),
    ("/api/v1/jobs?limit=5000", "GET", 400, "from 1 to 1000"),
    ("/api/v1/jobs?page=xyz", "GET", 400, "page_token: not a token"),
    ("/api/v1/jobs?colour=red", "GET", 400, "query parameter 'colour' is not known"),
    ("/api/v1/jobs?queue=a&queue=b", "GET", 400, "queue: given 2 times"),
    ("/api/v1/usage?by=planet", "GET", 400, "by: 'planet' is not one of"),
    ("/api/v1/usage?since=soon", "GET", 400, "since: 'soon' is not a duration"),
    ("/api/v1/jobs/1/logs?tail=0", "GET", 400, "tail '0': must be a whole number from 1"),
    ("/api/v1/jobs/1/logs?follow=1", "GET", 400, "query parameter 'follow' is not known"),
    ("/api/v1/jobs/1/logs", "POST", 405, "use GET"),
    ("/api/v1/jobs/1/cancel", "GET", 405, "use POST"),
    ("/api/v1/jobs", "POST", 405, "use GET"),
    ("/api/v1/nothing", "GET", 404, "no such API path"),
])
def test_bad_requests_are_refused_and_change_nothing(system, path, method, status, text):
    [job_id] = system.client.submit([job_doc(duration="600s")])
    got, body, _ = call(system, path, method=method)
    assert got == status and text in body["error"], body
    assert "Traceback" not in body["error"]
    assert system.client.get(job_id)["state"] != "CANCELLED"


def test_pages_are_served_with_a_strict_policy_and_metrics_stay(system):
    status, page, headers = call(system, "/", token=None)
    assert status == 200 and '<script src="/static/console.js"' in page and "<script>" not in page
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy
    assert headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/login", "/jobs/7", "/queues", "/clusters", "/usage", "/static/console.js", "/static/console.css"):
        assert call(system, path, token=None)[0] == 200, path
    assert call(system, "/nowhere", token=None)[0] == 404

    status, text, headers = call(system, "/metrics", token=None)
    assert status == 200 and headers["Content-Type"].startswith("text/plain") and "# TYPE sluice_" in text


def test_gateway_socket_is_private_and_removed_at_stop(system):
    directory = system.dispatcher._console_dir
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700 and (directory / "grpc.sock").exists()
    system.dispatcher.stop()
    assert not directory.exists()
