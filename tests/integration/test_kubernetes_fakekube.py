"""The fake API server itself, driven by the real `kubernetes` client: if it answers like an API server
here, the agent's tests against it mean something."""
from __future__ import annotations

import json
import time

import pytest
import urllib3
from kubernetes import client, config

from tests.fakekube import FakeKube


@pytest.fixture
def fake(tmp_path):
    with FakeKube() as server:
        server.add_namespace("team")
        server.kubeconfig(tmp_path / "kubeconfig")
        yield server


@pytest.fixture
def api(fake, tmp_path):
    api_client = config.new_client_from_config(config_file=str(tmp_path / "kubeconfig"), context="fake")
    yield client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    api_client.close()


def pod(name, labels=None, **spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}], **spec}}


def body(response):
    return json.loads(response.data)


def error(call, *args, **kwargs) -> tuple[int, dict]:
    with pytest.raises(client.ApiException) as info:
        call(*args, **kwargs, _preload_content=False)
    return info.value.status, json.loads(info.value.body)


def test_create_conflict_invalid_and_missing_namespace(api, fake):
    core, _ = api
    created = body(core.create_namespaced_pod("team", pod("a"), _preload_content=False))
    assert (created["metadata"]["uid"] and created["metadata"]["resourceVersion"]
            and created["status"]["phase"] == "Pending")
    assert fake.tokens == {"fake-token"}
    status, answer = error(core.create_namespaced_pod, "team", pod("a"))
    assert (status, answer["reason"]) == (409, "AlreadyExists")
    status, answer = error(core.create_namespaced_pod, "nowhere", pod("b"))
    assert (status, answer["reason"], answer["message"]) == (404, "NotFound", 'namespaces "nowhere" not found')
    bad = pod("c", {"app": "not a valid value!"})
    bad["spec"]["containers"][0]["image"] = ""
    status, answer = error(core.create_namespaced_pod, "team", bad)
    assert (status, answer["reason"]) == (422, "Invalid")
    fields = {cause["field"] for cause in answer["details"]["causes"]}
    assert {"metadata.labels", "spec.containers[0].image"} <= fields
    schema = pod("d")
    schema["spec"]["containers"][0]["ports"] = [{"containerPort": "eighty"}]  # the OpenAPI schema says integer
    schema_body = json.dumps(schema)
    response = core.api_client.rest_client.request("POST", f"{fake.url}/api/v1/namespaces/team/pods",
                                                   headers={"Content-Type": "application/json"},
                                                   body=json.loads(schema_body))
    response.read()
    assert response.status == 422 and "containerPort" in json.loads(response.data)["message"]
    assert fake.get("pods", "team", "c") is None and fake.get("pods", "team", "d") is None


def test_selectors(api, fake):
    core, _ = api
    for name, labels in (("a", {"tier": "web", "sluice.io/job-id": "1"}), ("b", {"tier": "db"}), ("c", {})):
        core.create_namespaced_pod("team", pod(name, labels), _preload_content=False)
    fake.succeed_pod("team", "b")

    def names(**kwargs):
        return sorted(p["metadata"]["name"]
                      for p in body(core.list_pod_for_all_namespaces(_preload_content=False, **kwargs))["items"])
    assert names(label_selector="tier=web") == ["a"]
    assert names(label_selector="tier!=web") == ["b", "c"]
    assert names(label_selector="tier in (web,db)") == ["a", "b"]
    assert names(label_selector="tier notin (web)") == ["b", "c"]
    assert names(label_selector="sluice.io/job-id") == ["a"]
    assert names(label_selector="!tier") == ["c"]
    assert names(field_selector="status.phase!=Succeeded") == ["a", "c"]


def watch_events(core, rv, timeout=1):
    response = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, timeout_seconds=timeout,
                                                _preload_content=False)
    return [json.loads(line) for line in response.data.decode().splitlines() if line.strip()]


def test_watch_from_a_resource_version_and_410_after_compaction(api, fake):
    core, _ = api
    listed = body(core.list_pod_for_all_namespaces(_preload_content=False))
    rv = listed["metadata"]["resourceVersion"]
    core.create_namespaced_pod("team", pod("a"), _preload_content=False)
    fake.run_pod("team", "a")
    core.delete_namespaced_pod("a", "team", _preload_content=False)
    time.sleep(0.2)  # the kubelet's graceful termination
    events = watch_events(core, rv)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == \
        [("ADDED", "a"), ("MODIFIED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]  # created, running, terminating, gone
    assert events[2]["object"]["metadata"]["deletionTimestamp"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions)
    assert [e["type"] for e in watch_events(core, str(versions[1]))] == ["MODIFIED", "DELETED"]
    fake.compact()
    [expired] = watch_events(core, rv)
    assert expired["type"] == "ERROR" and expired["object"]["code"] == 410 and expired["object"]["reason"] == "Expired"


def test_faults_on_demand(api, fake):
    core, _ = api
    fake.fail(429, path="/pods$")
    status, answer = error(core.list_namespaced_pod, "team")
    assert (status, answer["reason"]) == (429, "TooManyRequests")
    fake.fail(429, path="/pods$", retry_after=3)
    raw = urllib3.PoolManager().request("GET", f"{fake.url}/api/v1/namespaces/team/pods", retries=False)
    assert raw.status == 429 and raw.headers["Retry-After"] == "3"
    fake.fail(503, method="GET", path="/pods$")
    assert error(core.list_namespaced_pod, "team")[0] == 503
    assert body(core.list_namespaced_pod("team", _preload_content=False))["items"] == []


def test_job_controller_and_foreground_deletion(api, fake):
    _, batch = api
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed", "backoffLimit": 0,
                    "template": {"metadata": {"labels": {"sluice.io/job-id": "7"}},
                                 "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}}}}
    batch.create_namespaced_job("team", job, _preload_content=False)
    pods = fake.list("pods", "team", "sluice.io/job-id=7")
    assert len(pods) == 2 and all(p["metadata"]["ownerReferences"][0]["name"] == "j" for p in pods)
    assert sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    for p in pods:
        fake.run_pod("team", p["metadata"]["name"])
    fake.fail_pod("team", pods[0]["metadata"]["name"], exit_code=2)
    failed = fake.get("jobs", "team", "j")
    assert any(c["type"] == "Failed" and c["reason"] == "BackoffLimitExceeded" for c in failed["status"]["conditions"])
    batch.delete_namespaced_job("j", "team", body={"propagationPolicy": "Foreground"}, _preload_content=False)
    assert fake.deletions[-1] == ("jobs", "team", "j", "Foreground")
    deadline = time.monotonic() + 5
    while fake.get("jobs", "team", "j") is not None or fake.list("pods", "team"):
        assert time.monotonic() < deadline, "foreground deletion did not finish"
        time.sleep(0.02)
    invalid = {**job, "metadata": {"name": "k"}}
    invalid["spec"] = {**job["spec"], "template": {"spec": {"restartPolicy": "Always",
                                                            "containers": [{"name": "m", "image": "x"}]}}}
    status, answer = error(batch.create_namespaced_job, "team", invalid)
    assert status == 422 and "restartPolicy" in answer["message"]


def test_autopilot_binds_first_fit_runs_and_ends_pods(api, fake):
    core, _ = api
    fake.add_node("n1", {"cpu": "2", "memory": "4Gi"})
    small = pod("small", {}, containers=[{"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}}}])
    small["metadata"]["annotations"] = {"fakekube.test/run-seconds": "0.1", "fakekube.test/exit-code": "3"}
    huge = pod("huge", {}, containers=[{"name": "m", "image": "x", "resources": {"requests": {"cpu": "8"}}}])
    core.create_namespaced_pod("team", small, _preload_content=False)
    core.create_namespaced_pod("team", huge, _preload_content=False)
    fake.autopilot()
    deadline = time.monotonic() + 5
    while fake.get("pods", "team", "small")["status"]["phase"] != "Failed":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    ended = fake.get("pods", "team", "small")
    assert ended["spec"]["nodeName"] == "n1"
    assert ended["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    waiting = fake.get("pods", "team", "huge")
    assert waiting["status"]["phase"] == "Pending"
    [scheduled] = [c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"
