"""The kubectl front door, whole: a user creates a suspended batch/v1 Job through cluster A's API server (the
real `kubernetes` client, as kubectl would, against a fake API server), A's agent (a real `sluice agent run`
process) submits it, the dispatcher runs it on cluster B (B's agent and API server), and A's Job mirrors its
state (annotations, the SluiceJob condition, Events). Deleting the Job in A cancels the job on B; an agent
killed -9 and restarted submits nothing twice; a Job its namespace may not submit is marked REFUSED."""
from __future__ import annotations

import signal

import pytest
from kubernetes import client as kube

from tests.fakekube import RUN_SECONDS_ANNOTATION, FakeKube
from tests.integration.test_kubernetes_agent import (
    Agents,
    attempt_pods,
    kube_api,
    running_dispatcher,
    wait_state,
    wait_until,
)

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: vision}
spec: {serviceClasses: [standard]}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: private}
spec: {serviceClasses: [standard]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: kube-a}
spec:
  tier: onprem
  kubernetes:
    intake:
      team-a: {user: alice, queues: [vision]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: kube-b}
spec:
  tier: onprem
  kubernetes: {namespaces: {vision: ml}}
"""


@pytest.fixture
def fakes(tmp_path):
    a, b = FakeKube().start(), FakeKube().start()
    a.add_namespace("team-a")  # A has no node: nothing can run there, B has room
    b.add_namespace("ml")
    b.add_node("node-0", {"cpu": "8", "memory": "32Gi", "pods": "110"})
    b.autopilot()
    for name, server in (("kube-a", a), ("kube-b", b)):
        server.kubeconfig(tmp_path / f"{name}.kubeconfig", context=name)
    yield {"kube-a": a, "kube-b": b}
    a.stop()
    b.stop()


@pytest.fixture
def dispatcher(db_url, tmp_path):
    with running_dispatcher(db_url, tmp_path, OBJECTS, ("kube-a", "kube-b")) as d:
        yield d


@pytest.fixture
def agents(dispatcher, fakes, tmp_path):
    launcher = Agents(dispatcher, tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
def kubectl(fakes, tmp_path):
    """Cluster A's API as a user's kubectl calls it."""
    with kube_api(tmp_path, "kube-a", kube.BatchV1Api) as api:
        yield api


def user_job(name: str, *, queue: str = "vision", run_seconds: float = 1.0) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"sluice.io/queue": queue}},
            "spec": {"suspend": True, "parallelism": 2, "backoffLimit": 0, "template": {
                "metadata": {"annotations": {RUN_SECONDS_ANNOTATION: str(run_seconds)}},
                "spec": {"restartPolicy": "Never", "containers": [
                    {"name": "main", "image": "train:1", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}}


def annotations(fake: FakeKube, name: str) -> dict:
    job = fake.get("jobs", "team-a", name)
    return (job or {}).get("metadata", {}).get("annotations") or {}


def wait_annotated(fake: FakeKube, name: str, states: tuple[str, ...], timeout: float = 30.0) -> dict:
    wait_until(lambda: annotations(fake, name).get("sluice.io/state") in states, timeout,
               what=f"Job {name} annotated {states} (it is {annotations(fake, name)})")
    return annotations(fake, name)


def condition_of(fake: FakeKube, name: str) -> dict:
    conditions = ((fake.get("jobs", "team-a", name) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "SluiceJob"), {})


def wait_condition(fake: FakeKube, name: str, reason: str) -> None:
    wait_until(lambda: condition_of(fake, name).get("reason") == reason, 10,
               what=f"Job {name}'s SluiceJob condition {reason} (it is {condition_of(fake, name)})")


def test_a_job_created_in_cluster_a_runs_on_b_and_its_state_returns_to_a(dispatcher, fakes, agents, kubectl):
    a, b = fakes["kube-a"], fakes["kube-b"]
    agents.start("kube-b")
    first = agents.start("kube-a")
    kubectl.create_namespaced_job("team-a", user_job("train", run_seconds=2.0))
    running = wait_annotated(a, "train", ("DISPATCHED", "RUNNING"))
    job_id = int(running["sluice.io/job-id"])
    assert running["sluice.io/cluster"] == "kube-b"
    first.send_signal(signal.SIGKILL)  # mid-run: the restarted agent re-lists the Job and submits nothing twice
    first.wait(10)
    agents.start("kube-a")
    done = wait_annotated(a, "train", ("SUCCEEDED", "FAILED", "CANCELLED"))
    assert done["sluice.io/state"] == "SUCCEEDED" and done["sluice.io/job-id"] == str(job_id)
    assert [j["id"] for j in dispatcher.client.list()] == [job_id]
    job = dispatcher.client.describe(job_id)
    assert job["submittedBy"] == "alice" and job["queue"] == "vision" and job["cluster"] == "kube-b"
    # It ran on B, as a gang of 2 pods in the vision queue's namespace there; A ran nothing.
    pods = attempt_pods(b, job_id, 1)
    assert len(pods) == 2 and {p["metadata"]["namespace"] for p in pods} == {"ml"}
    assert not a.list("pods")
    wait_condition(a, "train", "Succeeded")
    origin = a.get("jobs", "team-a", "train")
    assert origin["spec"]["suspend"] is True
    assert "sluice.io/cancel-on-delete" not in (origin["metadata"].get("finalizers") or [])  # its job ended
    assert f"Sluice job {job_id}: succeeded on cluster kube-b" in condition_of(a, "train")["message"]
    reasons = [e["reason"] for e in a.list("events", "team-a") if e["involvedObject"]["name"] == "train"]
    assert {"Queued", "Succeeded"} <= set(reasons)  # each change an Event (one may be lost to the kill -9)


def test_deleting_the_job_in_a_cancels_its_job_on_b(dispatcher, fakes, agents, kubectl):
    a, b = fakes["kube-a"], fakes["kube-b"]
    agents.start("kube-b")
    agents.start("kube-a")
    kubectl.create_namespaced_job("team-a", user_job("long", run_seconds=120.0))
    running = wait_annotated(a, "long", ("RUNNING",))
    job_id = int(running["sluice.io/job-id"])
    assert "sluice.io/cancel-on-delete" in a.get("jobs", "team-a", "long")["metadata"]["finalizers"]
    kubectl.delete_namespaced_job("long", "team-a")
    job = wait_state(dispatcher.client, job_id, ("CANCELLED",))
    assert "its Job team-a/long was deleted" in job["reason"]
    wait_until(lambda: a.get("jobs", "team-a", "long") is None, 20, what="the Job gone from A once its job ended")
    wait_until(lambda: not attempt_pods(b, job_id, 1), 20, what="the pods on B deleted")


def test_a_job_its_namespace_may_not_submit_is_marked_refused_and_nothing_runs(dispatcher, fakes, agents, kubectl):
    a = fakes["kube-a"]
    agents.start("kube-a")
    kubectl.create_namespaced_job("team-a", user_job("sneaky", queue="private"))
    refused = wait_annotated(a, "sneaky", ("REFUSED",))
    assert "'private' is not a queue namespace 'team-a' may submit to (vision)" in refused["sluice.io/reason"]
    wait_condition(a, "sneaky", "Refused")
    assert "sluice.io/cancel-on-delete" not in (a.get("jobs", "team-a", "sneaky")["metadata"].get("finalizers") or [])
    assert dispatcher.client.list() == []
    # Fixed by its owner (the label), it is sent again and submitted.
    kubectl.patch_namespaced_job("sneaky", "team-a", {"metadata": {"labels": {"sluice.io/queue": "vision"}}},
                                 _content_type="application/merge-patch+json")
    queued = wait_annotated(a, "sneaky", ("QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"))
    assert int(queued["sluice.io/job-id"]) > 0
