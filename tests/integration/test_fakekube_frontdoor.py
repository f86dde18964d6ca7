"""The fake API server's writes beyond create and delete, driven by the real `kubernetes` client: PATCH in
its three formats, PUT with optimistic concurrency, the status subresource, finalizers, suspended Jobs, and
CustomResourceDefinitions with their custom objects (what the kubectl front door of Sluice needs)."""
from __future__ import annotations

import json
import threading
import time

import pytest
import urllib3
from kubernetes import client, config, dynamic

from tests.fakekube import ApiError, FakeKube
from tests.fakekube.patch import strategic_merge_patch

NS = "team"
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def fake(tmp_path):
    with FakeKube() as server:
        server.add_namespace(NS)
        server.kubeconfig(tmp_path / "kubeconfig")
        yield server
        assert server.errors == []  # the fake answered every request on purpose


@pytest.fixture
def api_client(fake, tmp_path):
    api_client = config.new_client_from_config(config_file=str(tmp_path / "kubeconfig"), context="fake")
    yield api_client
    api_client.close()


@pytest.fixture
def batch(api_client):
    return client.BatchV1Api(api_client)


@pytest.fixture
def core(api_client):
    return client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client):
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def ext(api_client):
    return client.ApiextensionsV1Api(api_client)


def body(response):
    return json.loads(response.data)


def error(call, *args, **kwargs) -> tuple[int, dict]:
    with pytest.raises(client.ApiException) as info:
        call(*args, **kwargs, _preload_content=False)
    return info.value.status, json.loads(info.value.body)


def job(name="j", *, suspend=None, labels=None, **spec):
    template = {"metadata": {"labels": {"app": "train"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "train:1"}]}}
    out = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels or {}},
           "spec": {"template": template, **spec}}
    if suspend is not None:
        out["spec"]["suspend"] = suspend
    return out


def condition(obj, kind):
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def wait_until(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- the front door, end to end -----------------------------------------------------------------------

def test_front_door_flow_of_a_suspended_job(fake, batch):
    """What Sluice's agent does with a Job a user created suspended with a queue label."""
    batch.create_namespaced_job(NS, job("train", suspend=True, labels={"sluice.io/queue": "vision"}),
                                _preload_content=False)
    listed = body(batch.list_job_for_all_namespaces(label_selector="sluice.io/queue", _preload_content=False))
    [found] = listed["items"]
    assert fake.list("pods", NS) == [] and found["metadata"]["generation"] == 1
    suspended = condition(found, "Suspended")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == ("True", "JobSuspended", "Job suspended")
    assert "startTime" not in found["status"]
    since = listed["metadata"]["resourceVersion"]

    # the agent takes it: an annotation and its finalizer (the client sends a strategic merge patch for a dict)
    taken = body(batch.patch_namespaced_job("train", NS, {"metadata": {
        "annotations": {"sluice.io/job-id": "41"}, "finalizers": ["sluice.io/dispatch"]}}, _preload_content=False))
    assert fake.requests[-1].content_type == SMP
    assert taken["metadata"]["finalizers"] == ["sluice.io/dispatch"]
    assert taken["metadata"]["generation"] == 1  # metadata is not spec
    # it writes its own condition into the status: merged by type next to the controller's
    admitted = {"type": "SluiceAdmitted", "status": "True", "reason": "Queued", "message": "queue vision",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}
    status = body(batch.patch_namespaced_job_status("train", NS, {"status": {"conditions": [admitted]}},
                                                    _preload_content=False))
    assert [c["type"] for c in status["status"]["conditions"]] == ["Suspended", "SluiceAdmitted"]
    # and lets it run
    resumed = body(batch.patch_namespaced_job("train", NS, {"spec": {"suspend": False}}, _preload_content=False))
    assert resumed["metadata"]["generation"] == 2
    assert len(fake.list("pods", NS)) == 1
    running = fake.get("jobs", NS, "train")
    assert running["status"]["startTime"] and running["status"]["active"] == 1
    suspended = condition(running, "Suspended")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == ("False", "JobResumed", "Job resumed")
    assert condition(running, "SluiceAdmitted")["reason"] == "Queued"
    assert [kind for kind, _ in fake.events("jobs", since)] == ["MODIFIED"] * 4  # taken, admitted, resumed, counted

    # the user deletes it (kubectl sends Background): the finalizer keeps it until the agent lets go
    gone = body(batch.delete_namespaced_job("train", NS, propagation_policy="Background", _preload_content=False))
    assert gone["metadata"]["deletionTimestamp"] and fake.get("jobs", NS, "train") is not None
    status, answer = error(batch.patch_namespaced_job, "train", NS, {"metadata": {"finalizers": ["other.io/x"]}})
    assert (status, answer["reason"]) == (422, "Invalid")
    assert "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found " \
           'new finalizers []string{"other.io/x"}' in answer["message"]
    let_go = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["sluice.io/dispatch"]}}
    batch.patch_namespaced_job("train", NS, let_go, _preload_content=False)
    assert fake.get("jobs", NS, "train") is None
    assert fake.events("jobs", since)[-1][0] == "DELETED"
    wait_until(lambda: fake.list("pods", NS) == [], what="the garbage collector to take the pods")


# -- PATCH ------------------------------------------------------------------------------------------

def test_patch_formats_on_a_namespaced_object(fake, batch):
    batch.create_namespaced_job(NS, job(suspend=True, labels={"a": "1"}), _preload_content=False)
    # strategic merge: maps merge, finalizers are a set
    batch.patch_namespaced_job("j", NS, {"metadata": {"labels": {"b": "2"}, "finalizers": ["x.io/one"]}},
                               _preload_content=False)
    patched = body(batch.patch_namespaced_job("j", NS, {"metadata": {"finalizers": ["x.io/two"]}},
                                              _preload_content=False))
    assert patched["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert patched["metadata"]["finalizers"] == ["x.io/one", "x.io/two"]
    # merge patch (RFC 7386): null deletes, lists replace
    merged = body(batch.patch_namespaced_job("j", NS, {"metadata": {"labels": {"a": None},
                                                                    "finalizers": ["x.io/three"]}},
                                             _content_type=MERGE, _preload_content=False))
    assert fake.requests[-1].content_type == MERGE
    assert merged["metadata"]["labels"] == {"b": "2"} and merged["metadata"]["finalizers"] == ["x.io/three"]
    # JSON patch (RFC 6902): the client sends a list as json-patch
    ops = [{"op": "test", "path": "/metadata/labels/b", "value": "2"},
           {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}},
           {"op": "replace", "path": "/metadata/labels/b", "value": "3"},
           {"op": "remove", "path": "/metadata/finalizers/0"}]
    patched = body(batch.patch_namespaced_job("j", NS, ops, _preload_content=False))
    assert fake.requests[-1].content_type == JSON_PATCH
    assert patched["metadata"]["labels"] == {"b": "3"} and patched["metadata"]["annotations"] == {"k": "v"}
    assert patched["metadata"].get("finalizers", []) == []
    # a failed test op, a path that is not there: 422, nothing written
    before = fake.get("jobs", NS, "j")
    status, answer = error(batch.patch_namespaced_job, "j", NS, [{"op": "test", "path": "/metadata/labels/b",
                                                                  "value": "9"}])
    assert (status, answer["reason"], answer["message"]) == \
        (422, "Invalid", "the server rejected our request due to an error in our request")
    assert answer["details"]["causes"][0]["message"] == "testing value /metadata/labels/b failed: test failed"
    assert error(batch.patch_namespaced_job, "j", NS, [{"op": "remove", "path": "/spec/nothing"}])[0] == 422
    assert error(batch.patch_namespaced_job, "j", NS, [{"op": "frobnicate", "path": "/spec"}])[0] == 422
    assert fake.get("jobs", NS, "j") == before
    # a JSON patch that is not a list, a merge patch that is not an object: 400
    # (the client itself turns a dict sent as json-patch into a strategic merge patch: sent raw here)
    url = f"{fake.url}/apis/batch/v1/namespaces/{NS}/jobs/j"
    raw = urllib3.PoolManager().request("PATCH", url, body=b'{"op": "add"}', headers={"Content-Type": JSON_PATCH})
    assert raw.status == 400 and json.loads(raw.data)["reason"] == "BadRequest"
    raw = urllib3.PoolManager().request("PATCH", url, body=b'["x"]', headers={"Content-Type": MERGE})
    assert raw.status == 400
    # the patched object is validated as a created one is
    status, answer = error(batch.patch_namespaced_job, "j", NS, {"metadata": {"labels": {"b": "not valid!"}}})
    assert (status, answer["reason"]) == (422, "Invalid") and answer["message"].startswith('Job.batch "j" is invalid')
    assert {c["field"] for c in answer["details"]["causes"]} == {"metadata.labels"}
    # an object that is not there
    status, answer = error(batch.patch_namespaced_job, "nope", NS, {"metadata": {"labels": {"a": "b"}}})
    assert (status, answer["message"]) == (404, 'jobs.batch "nope" not found')


def test_patch_content_types_versions_and_events(fake, batch):
    created = body(batch.create_namespaced_job(NS, job(suspend=True), _preload_content=False))
    rv = created["metadata"]["resourceVersion"]
    raw = urllib3.PoolManager()
    url = f"{fake.url}/apis/batch/v1/namespaces/{NS}/jobs/j"
    for content_type in ("text/plain", "application/apply-patch+yaml", "application/json"):
        answer = raw.request("PATCH", url, body=b"{}", headers={"Content-Type": content_type})
        assert answer.status == 415, content_type
        assert json.loads(answer.data)["reason"] == "UnsupportedMediaType"
    assert raw.request("PATCH", url, body=b"{not json", headers={"Content-Type": MERGE}).status == 400
    # a patch that changes nothing: 200, the same resourceVersion, no event
    same = body(batch.patch_namespaced_job("j", NS, {"metadata": {"labels": {}}}, _preload_content=False))
    assert same["metadata"]["resourceVersion"] == rv and fake.events("jobs", rv) == []
    # a change: a new resourceVersion and a MODIFIED event carrying it
    changed = body(batch.patch_namespaced_job("j", NS, {"metadata": {"labels": {"x": "y"}}}, _preload_content=False))
    assert int(changed["metadata"]["resourceVersion"]) > int(rv)
    [(kind, obj)] = fake.events("jobs", rv)
    assert kind == "MODIFIED" and obj["metadata"]["resourceVersion"] == changed["metadata"]["resourceVersion"]
    # metadata.resourceVersion in a patch is a precondition
    status, answer = error(batch.patch_namespaced_job, "j", NS, {"metadata": {"resourceVersion": rv,
                                                                             "labels": {"x": "z"}}})
    assert (status, answer["reason"]) == (409, "Conflict")
    assert answer["message"] == 'Operation cannot be fulfilled on jobs.batch "j": the object has been modified; ' \
                                "please apply your changes to the latest version and try again"
    current = changed["metadata"]["resourceVersion"]
    ok = body(batch.patch_namespaced_job("j", NS, {"metadata": {"resourceVersion": current, "labels": {"x": "z"}}},
                                         _preload_content=False))
    assert ok["metadata"]["labels"]["x"] == "z"
    # a patch may not rename the object
    status, answer = error(batch.patch_namespaced_job, "j", NS, {"metadata": {"name": "k"}})
    assert (status, answer["reason"]) == (400, "BadRequest") and "does not match the name on the URL" in \
        answer["message"]


def test_patch_cluster_scoped_objects_and_a_real_watch(fake, core):
    fake.add_node("n1", {"cpu": "4"})
    listed = body(core.list_node(_preload_content=False))
    patched = body(core.patch_node("n1", {"metadata": {"labels": {"pool": "gpu"}}, "spec": {"unschedulable": True}},
                                   _preload_content=False))
    assert patched["metadata"]["labels"]["pool"] == "gpu" and patched["spec"]["unschedulable"] is True
    core.patch_namespace(NS, [{"op": "add", "path": "/metadata/labels", "value": {"tier": "batch"}}],
                         _preload_content=False)
    assert fake.get("namespaces", "", NS)["metadata"]["labels"] == {"tier": "batch"}
    # a write to a node's object does not change its status (the kubelet's, through /status)
    core.patch_node("n1", {"status": {"allocatable": {"cpu": "64"}}}, _preload_content=False)
    assert fake.get("nodes", "", "n1")["status"]["allocatable"] == {"cpu": "4"}
    core.patch_node_status("n1", {"status": {"allocatable": {"cpu": "2"}}}, _preload_content=False)
    assert fake.get("nodes", "", "n1")["status"]["allocatable"] == {"cpu": "2"}
    response = core.list_node(watch=True, resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=1,
                              _preload_content=False)
    events = [json.loads(line) for line in response.data.decode().splitlines() if line.strip()]
    assert [e["type"] for e in events] == ["MODIFIED", "MODIFIED"]  # the labels, the status (the no-op is silent)
    assert events[0]["object"]["metadata"]["labels"]["pool"] == "gpu"


def test_a_watch_with_a_selector_sees_objects_enter_and_leave_it(fake, batch):
    listed = body(batch.list_namespaced_job(NS, _preload_content=False))
    batch.create_namespaced_job(NS, job("a", suspend=True, labels={"sluice.io/queue": "q"}), _preload_content=False)
    batch.create_namespaced_job(NS, job("b", suspend=True), _preload_content=False)
    batch.patch_namespaced_job("b", NS, {"metadata": {"labels": {"sluice.io/queue": "q"}}}, _preload_content=False)
    batch.patch_namespaced_job("a", NS, {"metadata": {"labels": {"sluice.io/queue": None}}}, _preload_content=False)
    batch.patch_namespaced_job("a", NS, {"metadata": {"annotations": {"x": "y"}}}, _preload_content=False)
    response = batch.list_namespaced_job(NS, watch=True, label_selector="sluice.io/queue",
                                         resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=1,
                                         _preload_content=False)
    events = [json.loads(line) for line in response.data.decode().splitlines() if line.strip()]
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    # a: created (and suspended by the controller), then its label goes; b: labelled later
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    assert events[-1]["object"]["metadata"]["labels"] == {"sluice.io/queue": "q"}  # as it was when it left


def test_pod_updates_are_limited_as_the_api_server_limits_them(fake, core):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "a:1"}]}}
    core.create_namespaced_pod(NS, pod, _preload_content=False)
    updated = body(core.patch_namespaced_pod("p", NS, {"spec": {"containers": [{"name": "m", "image": "a:2"}]}},
                                             _preload_content=False))
    assert updated["spec"]["containers"] == [{"name": "m", "image": "a:2"}]  # merged by name
    status, answer = error(core.patch_namespaced_pod, "p", NS, {"spec": {"restartPolicy": "OnFailure"}})
    assert status == 422 and "pod updates may not change fields other than" in answer["message"]


# -- PUT --------------------------------------------------------------------------------------------

def test_replace_with_optimistic_concurrency(fake, batch):
    batch.create_namespaced_job(NS, job(suspend=True), _preload_content=False)
    current = batch.read_namespaced_job("j", NS)  # a typed model: its times go back as +00:00
    current.metadata.labels = {"edited": "yes"}
    replaced = body(batch.replace_namespaced_job("j", NS, current, _preload_content=False))
    assert replaced["metadata"]["labels"] == {"edited": "yes"}
    assert replaced["metadata"]["creationTimestamp"].endswith("Z")
    stale = current  # still carries the resourceVersion before the replace
    stale.metadata.labels = {"edited": "again"}
    status, answer = error(batch.replace_namespaced_job, "j", NS, stale)
    assert (status, answer["reason"]) == (409, "Conflict")
    assert answer["message"].endswith("the object has been modified; please apply your changes to the latest "
                                      "version and try again")
    unconditional = fake.get("jobs", NS, "j")
    del unconditional["metadata"]["resourceVersion"]  # a Job takes an update without one
    unconditional["metadata"]["labels"] = {"edited": "blind"}
    assert body(batch.replace_namespaced_job("j", NS, unconditional, _preload_content=False))["metadata"]["labels"] \
        == {"edited": "blind"}
    renamed = fake.get("jobs", NS, "j")
    renamed["metadata"]["name"] = "k"
    assert error(batch.replace_namespaced_job, "j", NS, renamed)[0] == 400
    missing = job("nope")
    assert error(batch.replace_namespaced_job, "nope", NS, missing)[0] == 404
    # a PUT of the same object: no write
    same = fake.get("jobs", NS, "j")
    again = body(batch.replace_namespaced_job("j", NS, same, _preload_content=False))
    assert again["metadata"]["resourceVersion"] == same["metadata"]["resourceVersion"]


# -- the status subresource -------------------------------------------------------------------------

def test_job_status_subresource(fake, batch):
    batch.create_namespaced_job(NS, job(suspend=True), _preload_content=False)
    # a write to the Job leaves its status alone; a spec change bumps the generation, metadata does not
    written = body(batch.patch_namespaced_job("j", NS, {"metadata": {"labels": {"l": "1"}},
                                                       "status": {"active": 5}}, _preload_content=False))
    assert written["status"].get("active", 0) == 0 and written["metadata"]["generation"] == 1
    # a write to /status leaves the spec alone (metadata changes are kept: a Job's status strategy resets spec)
    through_status = body(batch.patch_namespaced_job_status("j", NS, {"spec": {"parallelism": 9},
                                                                      "status": {"conditions": [
                                                                          {"type": "A", "status": "True"}]}},
                                                            _preload_content=False))
    assert through_status["spec"]["parallelism"] == 1 and through_status["metadata"]["generation"] == 1
    assert [c["type"] for c in through_status["status"]["conditions"]] == ["Suspended", "A"]
    # strategic merge by type: an existing condition is updated in place, $patch delete removes one
    body(batch.patch_namespaced_job_status("j", NS, {"status": {"conditions": [
        {"type": "A", "status": "False", "reason": "Changed"}]}}, _preload_content=False))
    updated = body(batch.read_namespaced_job_status("j", NS, _preload_content=False))
    assert condition(updated, "A") == {"type": "A", "status": "False", "reason": "Changed"}
    body(batch.patch_namespaced_job_status("j", NS, {"status": {"conditions": [{"type": "A", "$patch": "delete"}]}},
                                           _preload_content=False))
    assert condition(fake.get("jobs", NS, "j"), "A") is None
    # a merge patch replaces the list
    replaced = body(batch.patch_namespaced_job_status("j", NS, {"status": {"conditions": [
        {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"},
        {"type": "B", "status": "True"}]}}, _content_type=MERGE, _preload_content=False))
    assert [c["type"] for c in replaced["status"]["conditions"]] == ["Suspended", "B"]
    # PUT /status
    current = fake.get("jobs", NS, "j")
    current["status"]["conditions"].append({"type": "C", "status": "True"})
    current["spec"]["parallelism"] = 4
    put = body(batch.replace_namespaced_job_status("j", NS, current, _preload_content=False))
    assert condition(put, "C") and put["spec"]["parallelism"] == 1
    # a spec change bumps the generation
    assert body(batch.patch_namespaced_job("j", NS, {"spec": {"parallelism": 2}},
                                           _preload_content=False))["metadata"]["generation"] == 2
    # what a status write may not do
    status, answer = error(batch.patch_namespaced_job_status, "j", NS, {"status": {"failed": -1}})
    assert status == 422 and "status.failed" in answer["message"]


def test_job_status_transitions_the_api_server_refuses(fake, batch):
    batch.create_namespaced_job(NS, job(backoffLimit=0), _preload_content=False)
    [pod] = fake.list("pods", NS)
    fake.fail_pod(NS, pod["metadata"]["name"])
    failed = fake.get("jobs", NS, "j")
    assert condition(failed, "Failed")["status"] == "True"
    status, answer = error(batch.patch_namespaced_job_status, "j", NS, {"status": {"conditions": None}},
                           _content_type=MERGE)
    assert status == 422 and "cannot disable the terminal Failed=True condition" in answer["message"]
    status, answer = error(batch.patch_namespaced_job_status, "j", NS, {"status": {"failed": 0}})
    assert status == 422 and "cannot decrease the failed counter" in answer["message"]
    # the controller keeps conditions it does not own
    body(batch.patch_namespaced_job_status("j", NS, {"status": {"conditions": [{"type": "Mine", "status": "True"}]}},
                                           _preload_content=False))
    assert [c["type"] for c in fake.get("jobs", NS, "j")["status"]["conditions"]] == \
        ["FailureTarget", "Failed", "Mine"]


# -- finalizers -------------------------------------------------------------------------------------

def test_finalizers_hold_a_deletion(fake, batch, core):
    batch.create_namespaced_job(NS, job(labels={"keep": "me"}), _preload_content=False)
    batch.patch_namespaced_job("j", NS, {"metadata": {"finalizers": ["sluice.io/a", "sluice.io/b"]}},
                               _preload_content=False)
    [pod] = fake.list("pods", NS)
    rv = fake.get("jobs", NS, "j")["metadata"]["resourceVersion"]
    deleted = body(batch.delete_namespaced_job("j", NS, body={"propagationPolicy": "Background"},
                                               _preload_content=False))
    meta = deleted["metadata"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 0 and meta["generation"] == 2
    assert [kind for kind, _ in fake.events("jobs", rv)] == ["MODIFIED"]
    assert fake.get("pods", NS, pod["metadata"]["name"]) is not None  # its owner is still there
    # deleting it again changes nothing
    again = body(batch.delete_namespaced_job("j", NS, propagation_policy="Background", _preload_content=False))
    assert again["metadata"]["resourceVersion"] == meta["resourceVersion"]
    # no new finalizer while it is being deleted, through any write
    status, answer = error(batch.patch_namespaced_job, "j", NS, [{"op": "add", "path": "/metadata/finalizers/-",
                                                                  "value": "sluice.io/c"}])
    assert status == 422 and "no new finalizers can be added" in answer["message"]
    # nor can a write take the deletion back (the API server keeps the deletion fields)
    kept = body(batch.patch_namespaced_job("j", NS, {"metadata": {"deletionTimestamp": None}}, _content_type=MERGE,
                                           _preload_content=False))
    assert kept["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"]
    assert kept["metadata"]["resourceVersion"] == meta["resourceVersion"]
    # removing one finalizer keeps it, removing the last deletes it (a DELETED event) and its pods after it
    body(batch.patch_namespaced_job("j", NS, [{"op": "remove", "path": "/metadata/finalizers/0"}],
                                    _preload_content=False))
    assert fake.get("jobs", NS, "j")["metadata"]["finalizers"] == ["sluice.io/b"]
    last = body(batch.patch_namespaced_job("j", NS, {"metadata": {"finalizers": None}}, _content_type=MERGE,
                                           _preload_content=False))
    assert last["metadata"]["name"] == "j" and fake.get("jobs", NS, "j") is None
    assert fake.events("jobs", rv)[-1][0] == "DELETED"
    wait_until(lambda: fake.get("pods", NS, pod["metadata"]["name"]) is None, what="the pod to go")


def test_finalizers_with_foreground_deletion_and_preconditions(fake, batch):
    batch.create_namespaced_job(NS, job(), _preload_content=False)
    batch.patch_namespaced_job("j", NS, {"metadata": {"finalizers": ["sluice.io/a"]}}, _preload_content=False)
    [pod] = fake.list("pods", NS)
    fake.run_pod(NS, pod["metadata"]["name"])  # on a node: it terminates gracefully
    current = fake.get("jobs", NS, "j")
    status, answer = error(batch.delete_namespaced_job, "j", NS,
                           body={"preconditions": {"resourceVersion": "1"}})
    assert (status, answer["reason"]) == (409, "Conflict")
    status, answer = error(batch.delete_namespaced_job, "j", NS, body={"preconditions": {"uid": "someone-else"}})
    assert status == 409 and "Precondition failed: UID in precondition" in answer["message"]
    batch.delete_namespaced_job("j", NS, body={"propagationPolicy": "Foreground", "preconditions": {
        "uid": current["metadata"]["uid"], "resourceVersion": current["metadata"]["resourceVersion"]}},
        _preload_content=False)
    marked = [obj for kind, obj in fake.events("jobs", current["metadata"]["resourceVersion"])]
    assert marked[0]["metadata"]["finalizers"] == ["sluice.io/a", "foregroundDeletion"]
    assert marked[0]["metadata"]["deletionTimestamp"]
    wait_until(lambda: fake.list("pods", NS) == [], what="the dependents to go")
    wait_until(lambda: fake.get("jobs", NS, "j")["metadata"]["finalizers"] == ["sluice.io/a"],
               what="the garbage collector to drop foregroundDeletion")
    batch.patch_namespaced_job("j", NS, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["sluice.io/a"]}},
                               _preload_content=False)
    assert fake.get("jobs", NS, "j") is None


def test_a_job_deleted_without_a_policy_orphans_its_pods(fake, batch):
    batch.create_namespaced_job(NS, job("bare"), _preload_content=False)
    batch.create_namespaced_job(NS, job("legacy"), _preload_content=False)
    answer = body(batch.delete_namespaced_job("bare", NS, _preload_content=False))
    assert (answer["kind"], answer["status"], answer["details"]["kind"]) == ("Status", "Success", "jobs")
    batch.delete_namespaced_job("legacy", NS, body={"orphanDependents": False}, _preload_content=False)
    assert fake.deletions[-2:] == [("jobs", NS, "bare", "Orphan"), ("jobs", NS, "legacy", "Background")]
    wait_until(lambda: len(fake.list("pods", NS)) == 1, what="the legacy Job's pod to go")
    [orphan] = fake.list("pods", NS)
    assert orphan["metadata"]["labels"]["job-name"] == "bare" and "ownerReferences" not in orphan["metadata"]


def test_finalizer_names_are_validated(batch):
    status, answer = error(batch.create_namespaced_job, NS, {**job(), "metadata": {
        "name": "j", "finalizers": ["not a name"]}})
    assert status == 422 and answer["details"]["causes"][0]["field"] == "metadata.finalizers[0]"


# -- suspended Jobs ---------------------------------------------------------------------------------

def test_suspend_resume_and_suspend_again(fake, batch):
    batch.create_namespaced_job(NS, job(suspend=True, parallelism=2, completions=2), _preload_content=False)
    assert fake.list("pods", NS) == []
    # while it is suspended and has never started, its scheduling directives may change
    mutable = {"spec": {"template": {"metadata": {"labels": {"sluice.io/cluster": "a"}, "annotations": {"n": "1"}},
                                     "spec": {"nodeSelector": {"pool": "gpu"},
                                              "tolerations": [{"key": "gpu", "operator": "Exists"}],
                                              "schedulingGates": [{"name": "sluice.io/admit"}],
                                              "affinity": {"nodeAffinity": {
                                                  "requiredDuringSchedulingIgnoredDuringExecution": {
                                                      "nodeSelectorTerms": [{"matchExpressions": [{
                                                          "key": "zone", "operator": "In", "values": ["a"]}]}]}}}}}}}
    changed = body(batch.patch_namespaced_job("j", NS, mutable, _preload_content=False))
    assert changed["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert changed["metadata"]["generation"] == 2
    # but not the rest of its template
    status, answer = error(batch.patch_namespaced_job, "j", NS, {"spec": {"template": {"spec": {
        "containers": [{"name": "main", "image": "train:2"}]}}}})
    assert (status, answer["reason"]) == (422, "Invalid")
    assert "spec.template: Invalid value: " in answer["message"] and answer["message"].endswith("field is immutable")
    status, answer = error(batch.patch_namespaced_job, "j", NS, {"spec": {"template": {"spec": {"affinity": {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}}}}}})
    assert status == 422 and "field is immutable" in answer["message"]
    body(batch.patch_namespaced_job("j", NS, [{"op": "remove", "path": "/spec/template/spec/schedulingGates"}],
                                    _preload_content=False))
    # resumed: pods, a start time, Suspended False
    body(batch.patch_namespaced_job("j", NS, {"spec": {"suspend": False}}, _preload_content=False))
    pods = fake.list("pods", NS)
    assert len(pods) == 2 and all(p["spec"]["nodeSelector"] == {"pool": "gpu"} for p in pods)
    running = fake.get("jobs", NS, "j")
    assert running["status"]["startTime"] and running["status"]["active"] == 2
    assert condition(running, "Suspended")["status"] == "False"
    # started: the template is immutable now, even when suspended again
    assert error(batch.patch_namespaced_job, "j", NS, {"spec": {"template": {"spec": {
        "nodeSelector": {"pool": "cpu"}}}}})[0] == 422
    for p in pods:
        fake.run_pod(NS, p["metadata"]["name"])
    body(batch.patch_namespaced_job("j", NS, {"spec": {"suspend": True}}, _preload_content=False))
    suspended = fake.get("jobs", NS, "j")
    again = condition(suspended, "Suspended")
    assert (again["status"], again["reason"]) == ("True", "JobSuspended") and suspended["status"]["active"] == 0
    assert all(p["metadata"].get("deletionTimestamp") for p in fake.list("pods", NS))
    wait_until(lambda: fake.list("pods", NS) == [], what="the suspended Job's pods to go")
    assert fake.get("jobs", NS, "j")["status"]["active"] == 0  # no replacement while suspended
    assert error(batch.patch_namespaced_job, "j", NS, {"spec": {"template": {"spec": {
        "nodeSelector": {"pool": "cpu"}}}}})[0] == 422
    # resumed again: new pods
    body(batch.patch_namespaced_job("j", NS, {"spec": {"suspend": False}}, _preload_content=False))
    assert len(fake.list("pods", NS)) == 2


def test_job_fields_that_never_change(fake, batch):
    batch.create_namespaced_job(NS, job(suspend=True, parallelism=2, completions=2), _preload_content=False)
    for patch, field in (({"spec": {"completions": 3}}, "spec.completions"),
                         ({"spec": {"completionMode": "Indexed"}}, "spec.completionMode"),
                         ({"spec": {"selector": {"matchLabels": {"a": "b"}}}}, "spec.selector"),
                         ({"spec": {"managedBy": "sluice.io/agent"}}, "spec.managedBy")):
        status, answer = error(batch.patch_namespaced_job, "j", NS, patch)
        assert status == 422, patch
        assert field in {c["field"] for c in answer["details"]["causes"]}, answer
        assert "field is immutable" in answer["message"]
    # an Indexed Job's completions move with its parallelism (ElasticIndexedJob)
    batch.create_namespaced_job(NS, job("ix", suspend=True, parallelism=2, completions=2, completionMode="Indexed"),
                                _preload_content=False)
    body(batch.patch_namespaced_job("ix", NS, {"spec": {"completions": 3, "parallelism": 3}}, _preload_content=False))
    status, answer = error(batch.patch_namespaced_job, "ix", NS, {"spec": {"completions": 4}})
    assert status == 422 and "can only be modified in tandem with spec.parallelism" in answer["message"]


def test_a_job_managed_by_another_controller_is_left_alone(fake, batch):
    batch.create_namespaced_job(NS, job("other", managedBy="sluice.io/agent"), _preload_content=False)
    batch.create_namespaced_job(NS, job("mine", managedBy="kubernetes.io/job-controller"), _preload_content=False)
    assert fake.get("jobs", NS, "other")["status"] == {}
    assert [p["metadata"]["ownerReferences"][0]["name"] for p in fake.list("pods", NS)] == ["mine"]
    status, answer = error(batch.create_namespaced_job, NS, job("bad", managedBy="no-slash"))
    assert status == 422 and "spec.managedBy" in answer["message"]


# -- CustomResourceDefinitions ----------------------------------------------------------------------

def queue_crd(**version):
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["weight"], "properties": {
            "weight": {"type": "integer", "minimum": 0, "maximum": 1000},
            "share": {"type": "number"},
            "parent": {"type": "string", "default": "root", "minLength": 1, "maxLength": 20,
                       "pattern": "^[a-z][-a-z0-9]*$"},
            "mode": {"type": "string", "enum": ["fair", "strict"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "minItems": 1},
            "guaranteed": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
            "note": {"type": "string", "nullable": True},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "flag": {"type": "boolean"}}},
        "status": {"type": "object", "properties": {
            "accepted": {"type": "boolean"}, "message": {"type": "string"},
            "observedGeneration": {"type": "integer", "format": "int64"},
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                           "items": {"type": "object", "required": ["type", "status"], "properties": {
                               "type": {"type": "string"}, "status": {"type": "string"},
                               "reason": {"type": "string"}}}}}}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "queues.sluice.io"},
            "spec": {"group": "sluice.io", "scope": "Cluster",
                     "names": {"plural": "queues", "singular": "queue", "kind": "Queue", "shortNames": ["sq"]},
                     "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                   "additionalPrinterColumns": [{"name": "Weight", "type": "integer",
                                                                 "jsonPath": ".spec.weight"}],
                                   "schema": {"openAPIV3Schema": schema}, **version}]}}


def queue(name="q", **spec):
    return {"apiVersion": "sluice.io/v1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"weight": 1, **spec}}


def test_crd_create_get_list_and_its_validation(fake, ext):
    created = body(ext.create_custom_resource_definition(queue_crd(), _preload_content=False))
    assert created["spec"]["names"]["listKind"] == "QueueList"
    assert {c["type"]: c["status"] for c in created["status"]["conditions"]} == \
        {"NamesAccepted": "True", "Established": "True"}
    assert created["status"]["storedVersions"] == ["v1"]
    got = ext.read_custom_resource_definition("queues.sluice.io")  # the typed model parses it
    assert got.spec.versions[0].additional_printer_columns[0].json_path == ".spec.weight"
    assert [c["metadata"]["name"] for c in body(ext.list_custom_resource_definition(_preload_content=False))["items"]] \
        == ["queues.sluice.io"]
    assert error(ext.create_custom_resource_definition, queue_crd())[0] == 409

    def refused(crd):
        status, answer = error(ext.create_custom_resource_definition, crd)
        assert (status, answer["reason"]) == (422, "Invalid"), answer
        return answer["message"]
    bad = queue_crd()
    bad["metadata"]["name"] = "queue.sluice.io"
    assert 'metadata.name: Invalid value: "queue.sluice.io": must be spec.names.plural+"."+spec.group' in refused(bad)
    untyped = queue_crd()
    untyped["metadata"]["name"] = "pools.sluice.io"
    untyped["spec"]["names"] = {"plural": "pools", "kind": "Pool"}
    del untyped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["share"]["type"]
    assert "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[share].type: Required value: must " \
           "not be empty for specified object fields" in refused(untyped)
    two_storage = queue_crd()
    two_storage["metadata"]["name"] = "pools.sluice.io"
    two_storage["spec"]["names"] = {"plural": "pools", "kind": "Pool"}
    two_storage["spec"]["versions"].append({**two_storage["spec"]["versions"][0], "name": "v2"})
    assert "must have exactly one version marked as storage version" in refused(two_storage)
    mixed = queue_crd()
    mixed["metadata"]["name"] = "pools.sluice.io"
    mixed["spec"]["names"] = {"plural": "pools", "kind": "Pool"}
    spec_schema = mixed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["additionalProperties"] = False
    spec_schema["properties"]["tags"]["uniqueItems"] = True
    message = refused(mixed)
    assert "additionalProperties and properties are mutual exclusive" in message
    assert "uniqueItems cannot be set to true" in message
    unknown_field = queue_crd()
    unknown_field["spec"]["bogus"] = True  # the CRD's own OpenAPI schema (kubernetes-validate); sent raw, as the
    answer = urllib3.PoolManager().request(  # client's models refuse it before sending
        "POST", f"{fake.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        body=json.dumps(unknown_field).encode(), headers={"Content-Type": "application/json"})
    assert answer.status == 422 and "bogus" in json.loads(answer.data)["message"]
    no_dot = queue_crd()
    no_dot["spec"]["group"] = "sluice"
    no_dot["metadata"]["name"] = "queues.sluice"
    assert "should be a domain with at least one dot" in refused(no_dot)


@pytest.mark.parametrize("change, expected", [
    (lambda root, spec: spec["properties"].update(list={"type": "array"}),
     "properties[spec].properties[list].items: Required value: must be specified"),
    (lambda root, spec: root.update(type="string"), "openAPIV3Schema.type: Invalid value: \"string\": must be object "
                                                    "at the root"),
    (lambda root, spec: root["properties"].update(metadata={"type": "object", "properties": {"labels": {
        "type": "object"}}}), "properties[metadata]: Forbidden: must not specify anything other than name and "
                              "generateName"),
    (lambda root, spec: spec.update({"x-kubernetes-preserve-unknown-fields": False}),
     "x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined"),
    (lambda root, spec: spec["properties"]["weight"].update(default="heavy"),
     "properties[weight].default: Invalid value: \"string\""),
    (lambda root, spec: spec["properties"]["parent"].update(pattern="(unclosed"),
     "properties[parent].pattern: Invalid value: \"(unclosed\": must be a valid regular expression"),
    (lambda root, spec: spec["properties"]["tags"].update({"x-kubernetes-list-type": "bag"}),
     'x-kubernetes-list-type: Unsupported value: "bag"'),
    (lambda root, spec: spec["properties"]["weight"].update(type="int"),
     'properties[weight].type: Unsupported value: "int"'),
    (lambda root, spec: spec["properties"].update(ref={"$ref": "#/definitions/x"}), "$ref is not supported"),
    (lambda root, spec: spec["properties"].update(either={"anyOf": [{"type": "string"}, {"type": "number"}]}),
     "properties[either].anyOf[0].type: Forbidden: must be empty to be structural"),
])
def test_crd_schemas_the_api_server_refuses(fake, change, expected):
    crd = queue_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    change(root, root["properties"]["spec"])
    answer = urllib3.PoolManager().request(
        "POST", f"{fake.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        body=json.dumps(crd).encode(), headers={"Content-Type": "application/json"})
    refusal = json.loads(answer.data)
    assert (answer.status, refusal["reason"]) == (422, "Invalid"), refusal
    assert expected in refusal["message"], refusal["message"]
    assert fake.get("customresourcedefinitions", "", "queues.sluice.io") is None


def test_a_bad_printer_column_is_refused(ext):
    crd = queue_crd()
    crd["spec"]["versions"][0]["additionalPrinterColumns"] = [{"name": "W", "type": "float", "jsonPath": ".spec.w"}]
    status, answer = error(ext.create_custom_resource_definition, crd)
    assert status == 422 and "additionalPrinterColumns[0].type: Invalid value: \"float\": must be one of" in \
        answer["message"]


def test_custom_objects_are_pruned_defaulted_and_validated(fake, ext, custom):
    ext.create_custom_resource_definition(queue_crd(), _preload_content=False)
    created = custom.create_cluster_custom_object("sluice.io", "v1", "queues", queue(
        "q", junk={"a": 1}, extra={"free": {"form": True}}, guaranteed={"cpu": 4, "memory": "8Gi"}),
        _preload_content=False)
    assert any(h.startswith("299") and 'unknown field \\"spec.junk\\"' in h
               for h in created.headers.getlist("Warning"))
    obj = body(created)
    assert obj["spec"] == {"weight": 1, "parent": "root", "extra": {"free": {"form": True}},
                           "guaranteed": {"cpu": 4, "memory": "8Gi"}}  # pruned, defaulted, preserved
    assert obj["metadata"]["generation"] == 1 and "status" not in obj
    # fieldValidation=Strict refuses unknown fields instead
    status, answer = error(custom.create_cluster_custom_object, "sluice.io", "v1", "queues", queue("s", junk=1),
                           field_validation="Strict")
    assert (status, answer["reason"]) == (400, "BadRequest") and 'unknown field "spec.junk"' in answer["message"]

    def violation(**spec):
        document = queue("bad")
        document["spec"] = spec
        status, answer = error(custom.create_cluster_custom_object, "sluice.io", "v1", "queues", document)
        assert (status, answer["reason"]) == (422, "Invalid"), answer
        assert answer["message"].startswith('Queue.sluice.io "bad" is invalid: '), answer["message"]
        return {f"{c['field']}: {c['message']}" for c in answer["details"]["causes"]}
    assert violation(weight="heavy") == {'spec.weight: Invalid value: "string": spec.weight in body must be of '
                                         'type integer: "string"'}
    assert violation(weight=1.5) == {'spec.weight: Invalid value: "number": spec.weight in body must be of type '
                                     'integer: "number"'}
    assert violation(weight=True) == {'spec.weight: Invalid value: "boolean": spec.weight in body must be of type '
                                      'integer: "boolean"'}
    assert violation(weight=-1) == {"spec.weight: Invalid value: -1: spec.weight in body should be greater than or "
                                    "equal to 0"}
    assert violation(weight=1001) == {"spec.weight: Invalid value: 1001: spec.weight in body should be less than or "
                                      "equal to 1000"}
    assert violation(parent="x") == {"spec.weight: Required value"}
    assert violation(weight=1, mode="loose") == {'spec.mode: Unsupported value: "loose": supported values: "fair", '
                                                 '"strict"'}
    assert violation(weight=1, parent="") == {
        'spec.parent: Invalid value: "": spec.parent in body should be at least 1 chars long',
        "spec.parent: Invalid value: \"\": spec.parent in body should match '^[a-z][-a-z0-9]*$'"}
    assert violation(weight=1, parent="a" * 21) == {"spec.parent: Too long: may not be more than 20 bytes"}
    assert violation(weight=1, parent="Root") == {"spec.parent: Invalid value: \"Root\": spec.parent in body should "
                                                  "match '^[a-z][-a-z0-9]*$'"}
    assert violation(weight=1, tags=["a", "b", "c"]) == {"spec.tags: Too many: 3: must have at most 2 items"}
    assert violation(weight=1, tags=[]) == {"spec.tags: Invalid value: 0: spec.tags in body should have at least 1 "
                                            "items"}
    assert violation(weight=1, tags=["a", 2]) == {'spec.tags[1]: Invalid value: "integer": spec.tags[1] in body '
                                                  'must be of type string: "integer"'}
    assert violation(weight=1, guaranteed={"gpu": 1.5}) == {
        'spec.guaranteed.gpu: Invalid value: "number": spec.guaranteed.gpu in body must be of type integer,string: '
        '"number"'}
    assert violation(weight=1, flag="yes") == {'spec.flag: Invalid value: "string": spec.flag in body must be of '
                                               'type boolean: "string"'}
    assert len(violation(weight="x", mode="y", tags=[])) == 3  # every violation, not the first
    nullable = body(custom.create_cluster_custom_object("sluice.io", "v1", "queues", queue("n", note=None, flag=None,
                                                                                          share=2),
                                                        _preload_content=False))
    assert nullable["spec"]["note"] is None and "flag" not in nullable["spec"]  # a null of a non-nullable field goes
    assert nullable["spec"]["share"] == 2


def test_custom_object_writes_status_subresource_and_concurrency(fake, ext, custom):
    ext.create_custom_resource_definition(queue_crd(), _preload_content=False)
    created = custom.create_cluster_custom_object("sluice.io", "v1", "queues", {**queue("q"),
                                                                                "status": {"accepted": True}})
    assert "status" not in created  # a create cannot set status
    rv = created["metadata"]["resourceVersion"]
    # the main resource ignores status, bumps the generation on spec changes only
    patched = custom.patch_cluster_custom_object("sluice.io", "v1", "queues", "q", {
        "metadata": {"labels": {"team": "vision"}}, "spec": {"weight": 5}, "status": {"accepted": True}})
    assert fake.requests[-1].content_type == MERGE
    assert patched["spec"]["weight"] == 5 and "status" not in patched and patched["metadata"]["generation"] == 2
    labels_only = custom.patch_cluster_custom_object("sluice.io", "v1", "queues", "q", {
        "metadata": {"labels": {"team": "nlp"}}})
    assert labels_only["metadata"]["generation"] == 2
    # /status changes only the status: spec and metadata changes there are ignored
    status = custom.patch_cluster_custom_object_status("sluice.io", "v1", "queues", "q", {
        "metadata": {"labels": {"team": "x"}}, "spec": {"weight": 9},
        "status": {"accepted": True, "message": "ok", "observedGeneration": 2, "bogus": 1,
                   "conditions": [{"type": "Accepted", "status": "True"}]}})
    assert status["spec"]["weight"] == 5 and status["metadata"]["labels"] == {"team": "nlp"}
    assert status["status"] == {"accepted": True, "message": "ok", "observedGeneration": 2,
                                "conditions": [{"type": "Accepted", "status": "True"}]}
    assert status["metadata"]["generation"] == 2
    assert custom.get_cluster_custom_object_status("sluice.io", "v1", "queues", "q")["status"]["accepted"] is True
    status_code, answer = error(custom.patch_cluster_custom_object_status, "sluice.io", "v1", "queues", "q", {
        "status": {"conditions": [{"type": "A", "status": "True"}, {"type": "A", "status": "False"}]}})
    assert status_code == 422 and "status.conditions[1]: Duplicate value" in answer["message"]
    # a status schema violation
    status_code, answer = error(custom.patch_cluster_custom_object_status, "sluice.io", "v1", "queues", "q", {
        "status": {"accepted": "yes"}})
    assert status_code == 422 and "status.accepted" in answer["message"]
    # JSON patch works on custom objects, strategic merge does not
    custom.patch_cluster_custom_object("sluice.io", "v1", "queues", "q", [
        {"op": "replace", "path": "/spec/weight", "value": 7}], _content_type=JSON_PATCH)
    assert fake.get("queues", "", "q")["spec"]["weight"] == 7
    status_code, answer = error(custom.patch_cluster_custom_object, "sluice.io", "v1", "queues", "q",
                                {"spec": {"weight": 8}}, _content_type=SMP)
    assert status_code == 415
    # PUT: a custom object needs its resourceVersion, and a current one
    current = custom.get_cluster_custom_object("sluice.io", "v1", "queues", "q")
    current["spec"]["weight"] = 11
    stale = json.loads(json.dumps(current))
    stale["metadata"]["resourceVersion"] = rv
    assert error(custom.replace_cluster_custom_object, "sluice.io", "v1", "queues", "q", stale)[0] == 409
    blind = json.loads(json.dumps(current))
    del blind["metadata"]["resourceVersion"]
    status_code, answer = error(custom.replace_cluster_custom_object, "sluice.io", "v1", "queues", "q", blind)
    assert status_code == 422 and "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update" \
        in answer["message"]
    replaced = custom.replace_cluster_custom_object("sluice.io", "v1", "queues", "q", current)
    assert replaced["spec"]["weight"] == 11 and replaced["status"]["accepted"] is True  # PUT keeps the status
    current = custom.get_cluster_custom_object("sluice.io", "v1", "queues", "q")
    current["status"]["message"] = "replaced"
    assert custom.replace_cluster_custom_object_status("sluice.io", "v1", "queues", "q",
                                                       current)["status"]["message"] == "replaced"
    # the kinds of events a watcher of queues sees
    assert [kind for kind, _ in fake.events("queues.sluice.io")][:1] == ["ADDED"]


def test_namespaced_custom_objects_selectors_watch_and_finalizers(fake, ext, custom):
    crd = queue_crd()
    crd["metadata"]["name"] = "burstpolicies.sluice.io"
    crd["spec"].update(scope="Namespaced", names={"plural": "burstpolicies", "kind": "BurstPolicy"})
    del crd["spec"]["versions"][0]["subresources"]  # no status subresource: status is written with the object
    ext.create_custom_resource_definition(crd, _preload_content=False)
    policy = {"apiVersion": "sluice.io/v1", "kind": "BurstPolicy", "metadata": {"name": "b", "labels": {"tier": "x"}},
              "spec": {"weight": 1}, "status": {"accepted": False}}
    created = custom.create_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies", policy)
    assert created["status"] == {"accepted": False}
    assert custom.patch_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies", "b", {
        "status": {"accepted": True}})["metadata"]["generation"] == 2  # status is content here
    assert error(custom.get_namespaced_custom_object_status, "sluice.io", "v1", NS, "burstpolicies", "b")[0] == 404
    custom.create_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies",
                                           {**policy, "metadata": {"name": "c"}})
    assert [o["metadata"]["name"] for o in custom.list_namespaced_custom_object(
        "sluice.io", "v1", NS, "burstpolicies", label_selector="tier=x")["items"]] == ["b"]
    assert len(custom.list_cluster_custom_object("sluice.io", "v1", "burstpolicies")["items"]) == 2
    assert error(custom.create_namespaced_custom_object, "sluice.io", "v1", "nowhere", "burstpolicies", policy)[0] \
        == 404
    listed = custom.list_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies")
    custom.patch_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies", "b",
                                          {"metadata": {"finalizers": ["sluice.io/sync"]}})
    deleting = custom.delete_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies", "b")
    assert deleting["metadata"]["deletionTimestamp"]
    gone = custom.delete_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies", "c")
    assert gone["kind"] == "Status" and gone["status"] == "Success"
    custom.patch_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies", "b", [
        {"op": "remove", "path": "/metadata/finalizers"}], _content_type=JSON_PATCH)
    response = custom.list_namespaced_custom_object("sluice.io", "v1", NS, "burstpolicies", watch=True,
                                                    resource_version=listed["metadata"]["resourceVersion"],
                                                    timeout_seconds=1, _preload_content=False)
    events = [json.loads(line) for line in response.data.decode().splitlines() if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == \
        [("MODIFIED", "b"), ("MODIFIED", "b"), ("DELETED", "c"), ("DELETED", "b")]
    assert all(e["object"]["apiVersion"] == "sluice.io/v1" for e in events)


def test_deleting_a_crd_deletes_its_objects_after_their_finalizers(fake, ext, custom):
    ext.create_custom_resource_definition(queue_crd(), _preload_content=False)
    custom.create_cluster_custom_object("sluice.io", "v1", "queues", queue("a"))
    held = queue("b")
    held["metadata"]["finalizers"] = ["sluice.io/sync"]
    custom.create_cluster_custom_object("sluice.io", "v1", "queues", held)
    deleted = body(ext.delete_custom_resource_definition("queues.sluice.io", _preload_content=False))
    assert deleted["metadata"]["deletionTimestamp"]
    crd = fake.get("customresourcedefinitions", "", "queues.sluice.io")
    assert crd["metadata"]["finalizers"] == ["customresourcecleanup.apiextensions.k8s.io"]
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Terminating"] == "True"
    assert fake.get("queues", "", "a") is None and fake.get("queues", "", "b")["metadata"]["deletionTimestamp"]
    status, answer = error(custom.create_cluster_custom_object, "sluice.io", "v1", "queues", queue("c"))
    assert status == 405 and "terminating" in answer["message"]
    custom.patch_cluster_custom_object("sluice.io", "v1", "queues", "b", {"metadata": {"finalizers": None}})
    assert fake.get("customresourcedefinitions", "", "queues.sluice.io") is None
    assert error(custom.list_cluster_custom_object, "sluice.io", "v1", "queues")[0] == 404


def test_crd_versions_updates_and_discovery(fake, ext, custom, api_client, tmp_path):
    crd = queue_crd()
    v1 = crd["spec"]["versions"][0]
    crd["spec"]["versions"] = [{**v1, "name": "v1beta1", "storage": False}, v1]
    ext.create_custom_resource_definition(crd, _preload_content=False)
    custom.create_cluster_custom_object("sluice.io", "v1beta1", "queues", {**queue("q"), "apiVersion":
                                                                           "sluice.io/v1beta1"})
    assert fake.get("queues", "", "q")["apiVersion"] == "sluice.io/v1"  # kept at the storage version
    assert custom.get_cluster_custom_object("sluice.io", "v1beta1", "queues", "q")["apiVersion"] == "sluice.io/v1beta1"
    groups = json.loads(urllib3.PoolManager().request("GET", f"{fake.url}/apis").data)
    [group] = [g for g in groups["groups"] if g["name"] == "sluice.io"]
    assert group["preferredVersion"]["version"] == "v1"
    assert {g["name"] for g in groups["groups"]} >= {"batch", "apiextensions.k8s.io"}
    resources = custom.get_api_resources("sluice.io", "v1")
    assert {r.name for r in resources.resources} == {"queues", "queues/status"}
    assert [r.short_names for r in resources.resources if r.name == "queues"] == [["sq"]]
    # the dynamic client discovers and uses it
    dyn = dynamic.DynamicClient(api_client, cache_file=str(tmp_path / "discovery.json"))
    queues = dyn.resources.get(api_version="sluice.io/v1", kind="Queue")
    assert queues.get(name="q").spec.weight == 1
    queues.patch(name="q", body={"spec": {"weight": 4}}, content_type=MERGE)
    assert fake.get("queues", "", "q")["spec"]["weight"] == 4
    jobs = dyn.resources.get(api_version="batch/v1", kind="Job")
    assert jobs.namespaced is True
    # a CRD update: served versions and schema follow it, names are immutable
    current = fake.get("customresourcedefinitions", "", "queues.sluice.io")
    current["spec"]["versions"][0]["served"] = False
    updated = body(ext.replace_custom_resource_definition("queues.sluice.io", current, _preload_content=False))
    assert updated["metadata"]["generation"] == 2
    assert error(custom.get_cluster_custom_object, "sluice.io", "v1beta1", "queues", "q")[0] == 404
    renamed = fake.get("customresourcedefinitions", "", "queues.sluice.io")
    renamed["spec"]["names"]["kind"] = "Line"
    status, answer = error(ext.replace_custom_resource_definition, "queues.sluice.io", renamed)
    assert status == 422 and "spec.names.kind" in answer["message"]
    assert error(custom.get_cluster_custom_object, "nope.io", "v1", "queues", "q")[0] == 404


# -- the rest: dry runs, test helpers, collections, odd bodies -----------------------------------------

def test_dry_run_validates_without_writing(fake, batch, ext, custom):
    created = body(batch.create_namespaced_job(NS, job("dry"), dry_run="All", _preload_content=False))
    assert created["metadata"]["uid"] and "resourceVersion" not in created["metadata"]
    assert fake.get("jobs", NS, "dry") is None and fake.list("pods", NS) == []
    assert error(batch.create_namespaced_job, NS, job("bad", labels={"x": "no good!"}), dry_run="All")[0] == 422
    batch.create_namespaced_job(NS, job(suspend=True), _preload_content=False)
    before = fake.get("jobs", NS, "j")
    patched = body(batch.patch_namespaced_job("j", NS, {"spec": {"suspend": False}}, dry_run="All",
                                              _preload_content=False))
    assert patched["spec"]["suspend"] is False and patched["metadata"]["generation"] == 2
    assert fake.get("jobs", NS, "j") == before and fake.list("pods", NS) == []
    assert error(batch.patch_namespaced_job, "j", NS, {"spec": {"completions": 5}}, dry_run="All")[0] == 422
    body(batch.delete_namespaced_job("j", NS, dry_run="All", _preload_content=False))
    assert fake.get("jobs", NS, "j") == before and fake.deletions == []
    ext.create_custom_resource_definition(queue_crd(), dry_run="All", _preload_content=False)
    assert fake.get("customresourcedefinitions", "", "queues.sluice.io") is None
    assert error(custom.list_cluster_custom_object, "sluice.io", "v1", "queues")[0] == 404
    raw = urllib3.PoolManager().request("DELETE", f"{fake.url}/apis/batch/v1/namespaces/{NS}/jobs/j?dryRun=Some")
    assert raw.status == 400


def test_helpers_for_tests_acting_as_other_clients(fake):
    fake.put(queue_crd())
    fake.put(queue("q"))
    assert fake.get("queues", "", "q") == fake.get("queues.sluice.io", "", "q")
    assert fake.list("queues")[0]["spec"]["parent"] == "root"
    assert fake.patch("queues", "", "q", {"status": {"accepted": True}}, subresource="status")["status"] == \
        {"accepted": True}
    assert fake.patch("queues", "", "q", [{"op": "replace", "path": "/spec/weight", "value": 3}],
                      content_type=JSON_PATCH)["spec"]["weight"] == 3
    with pytest.raises(ApiError) as refused:
        fake.patch("queues", "", "q", {"spec": {"weight": -3}})
    assert refused.value.code == 422 and "spec.weight" in refused.value.message
    assert [kind for kind, _ in fake.events("queues")] == ["ADDED", "MODIFIED", "MODIFIED"]
    fake.delete("queues", "", "q")
    assert fake.get("queues", "", "q") is None and fake.deletions[-1] == ("queues.sluice.io", "", "q", "Background")
    with pytest.raises(KeyError):
        fake.get("widgets", "", "w")


def test_a_watch_of_custom_objects_ends_when_their_crd_goes(fake, ext, custom):
    ext.create_custom_resource_definition(queue_crd(), _preload_content=False)
    custom.create_cluster_custom_object("sluice.io", "v1", "queues", queue("q"))
    lines: list[dict] = []

    def watch():
        response = custom.list_cluster_custom_object("sluice.io", "v1", "queues", watch=True, timeout_seconds=30,
                                                     _preload_content=False)
        lines.extend(json.loads(line) for line in response.data.decode().splitlines() if line.strip())
    watcher = threading.Thread(target=watch)
    watcher.start()
    wait_until(lambda: fake.requests_matching("GET", "/queues$", watch="true"), what="the watch to start")
    time.sleep(0.1)
    started = time.monotonic()
    ext.delete_custom_resource_definition("queues.sluice.io", _preload_content=False)
    watcher.join(5)
    assert not watcher.is_alive() and time.monotonic() - started < 5
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "q"), ("DELETED", "q")]


def test_delete_collection(fake, ext, custom, batch):
    ext.create_custom_resource_definition(queue_crd(), _preload_content=False)
    for name, team in (("a", "x"), ("b", "x"), ("c", "y")):
        document = queue(name)
        document["metadata"]["labels"] = {"team": team}
        custom.create_cluster_custom_object("sluice.io", "v1", "queues", document)
    gone = custom.delete_collection_cluster_custom_object("sluice.io", "v1", "queues", label_selector="team=x")
    assert sorted(o["metadata"]["name"] for o in gone["items"]) == ["a", "b"]
    assert [o["metadata"]["name"] for o in fake.list("queues")] == ["c"]
    batch.create_namespaced_job(NS, job("one"), _preload_content=False)
    batch.delete_collection_namespaced_job(NS, _preload_content=False)
    assert fake.list("jobs", NS) == []


def test_strategic_merge_of_lists(fake, batch, core):
    document = job(suspend=True)
    document["spec"]["template"]["spec"]["tolerations"] = [{"key": "a", "operator": "Exists"}]
    batch.create_namespaced_job(NS, document, _preload_content=False)
    patched = body(batch.patch_namespaced_job("j", NS, {"spec": {"template": {"spec": {
        "tolerations": [{"key": "b", "operator": "Exists"}]}}}}, _preload_content=False))
    assert patched["spec"]["template"]["spec"]["tolerations"] == [{"key": "b", "operator": "Exists"}]  # replaced
    status, answer = error(batch.patch_namespaced_job, "j", NS, {"spec": {"template": {"spec": {"containers": [
        {"image": "no-name"}]}}}})
    assert status == 400 and "does not contain declared merge key: name" in answer["message"]
    # containers merge by name (a pod's images may change)
    containers = [{"name": "main", "image": "a:1", "env": [{"name": "A", "value": "1"}]},
                  {"name": "side", "image": "s:1"}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"restartPolicy": "Never", "containers": containers}}
    core.create_namespaced_pod(NS, pod, _preload_content=False)
    merged = body(core.patch_namespaced_pod("p", NS, {"spec": {"containers": [{"name": "side", "image": "s:2"}]}},
                                            _preload_content=False))
    assert [(c["name"], c["image"]) for c in merged["spec"]["containers"]] == [("main", "a:1"), ("side", "s:2")]
    # a container's env merges by name, $patch: delete removes an element, $patch: replace a whole list
    spec = {"spec": {"containers": [{"name": "m", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}]}}
    out = strategic_merge_patch(spec, {"spec": {"containers": [{"name": "m", "env": [
        {"name": "B", "value": "3"}, {"name": "C", "value": "4"}, {"name": "A", "$patch": "delete"}]}]}})
    assert out["spec"]["containers"][0]["env"] == [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]
    out = strategic_merge_patch(spec, {"spec": {"containers": [{"name": "n"}, {"$patch": "replace"}]}})
    assert out["spec"]["containers"] == [{"name": "n"}]
    out = strategic_merge_patch({"metadata": {"labels": {"a": "1", "b": "2"}}},
                                {"metadata": {"labels": {"$patch": "replace", "c": "3"}}})
    assert out["metadata"]["labels"] == {"c": "3"}


def test_bodies_of_the_wrong_shape_are_refused_not_crashed_on(fake, batch, ext, custom):
    batch.create_namespaced_job(NS, job(suspend=True), _preload_content=False)
    status, answer = error(batch.patch_namespaced_job, "j", NS, {"spec": {"template": "a string"}},
                           _content_type=MERGE)
    assert (status, answer["reason"]) == (422, "Invalid")
    ext.create_custom_resource_definition(queue_crd(), _preload_content=False)
    raw = urllib3.PoolManager()
    answer = raw.request("POST", f"{fake.url}/apis/sluice.io/v1/queues", headers={"Content-Type": "application/json"},
                         body=json.dumps({**queue("w"), "metadata": {"name": "w", "labels": ["x"]}}).encode())
    assert answer.status == 422
    answer = raw.request("PUT", f"{fake.url}/apis/batch/v1/namespaces/{NS}/jobs/j", body=b"[1, 2]",
                         headers={"Content-Type": "application/json"})
    assert answer.status == 400
    answer = raw.request("POST", f"{fake.url}/apis/sluice.io/v1/queues", body=b"{",
                         headers={"Content-Type": "application/json"})
    assert answer.status == 400
    assert error(custom.create_cluster_custom_object, "sluice.io", "v1", "queues",
                 {**queue("v"), "kind": "Line"})[0] == 400
