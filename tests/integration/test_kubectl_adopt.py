"""The kubectl front door when Sluice places a Job's job on the Job's own cluster: the agent adopts that very
Job (one conditional merge patch: Sluice's labels and annotations on it and its pod template, unsuspended)
instead of creating a copy, never deletes it, and suspends it again when the attempt is cancelled. A real
dispatcher and real `sluice agent run` processes drive a fake API server (tests/fakekube) through the real
`kubernetes` client; the user's Jobs are created through it as kubectl would. A Job that cannot run the
attempt itself (another uid, not suspended, adopted before, gone) gets a copy, as any job; a repeated dispatch
command, also to an agent killed -9 and restarted, changes nothing."""
from __future__ import annotations

import signal
from dataclasses import replace

import pytest
from kubernetes import client as kube
from sqlalchemy import insert, select

from agent.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from dispatcher.services import submitting
from dispatcher.store.channels import OUTBOX_CHANNEL, notify
from dispatcher.store.models import OutboxCommand
from dispatcher.store.tokens import Principal
from sluice.spec import JobSpec, Origin, job_from_document
from tests.fakekube import RUN_SECONDS_ANNOTATION, FakeKube
from tests.integration.test_kubectl_front_door import condition_of, user_job, wait_annotated, wait_condition
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
kind: Cluster
metadata: {name: kube-a}
spec:
  tier: onprem
  kubernetes:
    namespaces: {vision: ml}
    intake:
      team-a: {user: alice, queues: [vision]}
"""
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
SLUICE_LABELS = ("sluice.io/job-id", "sluice.io/attempt", "sluice.io/pod-set", "app.kubernetes.io/managed-by")


@pytest.fixture
def fake(tmp_path):
    server = FakeKube().start()
    server.add_namespace("team-a")  # where users create their Jobs
    server.add_namespace("ml")  # where the vision queue's copies go
    server.add_node("node-0", {"cpu": "8", "memory": "32Gi", "pods": "110"})
    server.autopilot()
    server.kubeconfig(tmp_path / "kube-a.kubeconfig", context="kube-a")
    yield server
    server.stop()


@pytest.fixture
def dispatcher(db_url, tmp_path):
    with running_dispatcher(db_url, tmp_path, OBJECTS, ("kube-a",)) as d:
        yield d


@pytest.fixture
def agents(dispatcher, fake, tmp_path):
    launcher = Agents(dispatcher, tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
def kubectl(fake, tmp_path):
    """The cluster's API as a user's kubectl calls it."""
    with kube_api(tmp_path, "kube-a", kube.BatchV1Api) as api:
        yield api


def the_job(fake: FakeKube, name: str) -> dict:
    return fake.get("jobs", "team-a", name) or {}


def dispatch_again(dispatcher, job_id: int, attempt: int) -> None:
    """The dispatcher sends the attempt's dispatch command once more (as after an ack it never got); returns once
    the agent acked it, i.e. applied it."""
    with dispatcher.sessions.begin() as session:
        command = session.execute(insert(OutboxCommand).values(cluster="kube-a", kind="dispatch", job_id=job_id,
                                                               attempt=attempt).returning(OutboxCommand.id)).scalar()
        notify(session, OUTBOX_CHANNEL, "kube-a")

    def acked() -> bool:
        with dispatcher.sessions.begin() as session:
            return session.scalar(select(OutboxCommand.acked_at).where(OutboxCommand.id == command)) is not None
    wait_until(acked, 15, what=f"the agent to ack dispatch command {command} again")


def sluice_marks(job: dict) -> tuple:
    """What adopting a Job writes on it (a second adoption would write it again, with a new created-at)."""
    metadata = job["metadata"]
    annotations = metadata.get("annotations") or {}
    return (metadata.get("generation"), dict(metadata.get("labels") or {}),
            annotations.get("sluice.io/adopted"), annotations.get("sluice.io/created-at"),
            job["spec"]["template"]["metadata"])


def sluice_objects_elsewhere(fake: FakeKube, name: str) -> list[str]:
    """Every Job and pod in the cluster that is neither the user's Job `name` nor one of its pods."""
    jobs = [f"job {j['metadata']['namespace']}/{j['metadata']['name']}" for j in fake.list("jobs")
            if (j["metadata"]["namespace"], j["metadata"]["name"]) != ("team-a", name)]
    uid = the_job(fake, name).get("metadata", {}).get("uid")
    pods = [f"pod {p['metadata']['namespace']}/{p['metadata']['name']}" for p in fake.list("pods")
            if not any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences") or [])]
    return jobs + pods


def test_a_job_placed_on_its_own_cluster_runs_as_that_very_job(dispatcher, fake, agents, kubectl):
    agents.start("kube-a")
    uid = kubectl.create_namespaced_job("team-a", user_job("train", run_seconds=3.0)).metadata.uid
    running = wait_annotated(fake, "train", ("RUNNING",))
    job_id = int(running["sluice.io/job-id"])
    adopted = the_job(fake, "train")
    assert adopted["metadata"]["annotations"]["sluice.io/adopted"] == f"{job_id}-1"
    assert adopted["spec"]["suspend"] is False
    assert {k: adopted["metadata"]["labels"][k] for k in SLUICE_LABELS} == {
        "sluice.io/job-id": str(job_id), "sluice.io/attempt": "1", "sluice.io/pod-set": "job",
        "app.kubernetes.io/managed-by": "sluice"}
    assert adopted["metadata"]["annotations"]["sluice.io/gang-size"] == "2"
    # A second dispatch command for the same attempt changes nothing.
    before = sluice_marks(adopted)
    dispatch_again(dispatcher, job_id, 1)
    assert sluice_marks(the_job(fake, "train")) == before
    done = wait_annotated(fake, "train", FINAL)
    assert done["sluice.io/state"] == "SUCCEEDED" and done["sluice.io/cluster"] == "kube-a"
    job = wait_state(dispatcher.client, job_id, FINAL)
    assert (job["state"], job["cluster"], job["attempt"]) == ("SUCCEEDED", "kube-a", 1)
    assert [e["to"] for e in dispatcher.client.describe(job_id)["events"]] == [
        "QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    # It ran as that very Job: its two pods are the attempt's, made by its controller; Sluice made nothing else.
    pods = attempt_pods(fake, job_id, 1)
    assert len(pods) == 2 and all(p["status"]["phase"] == "Succeeded" for p in pods)
    assert all(p["metadata"]["namespace"] == "team-a" and p["metadata"]["ownerReferences"][0]["uid"] == uid
               and p["metadata"]["annotations"]["sluice.io/pod-set-index"] == "0" for p in pods)
    assert sluice_objects_elsewhere(fake, "train") == []
    final = the_job(fake, "train")
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in final["status"]["conditions"])
    assert final["spec"]["suspend"] is False and fake.deletions == []  # the user's, left as it ended
    wait_condition(fake, "train", "Succeeded")
    assert f"Sluice job {job_id}: succeeded on cluster kube-a" in condition_of(fake, "train")["message"]
    assert "sluice.io/cancel-on-delete" not in (final["metadata"].get("finalizers") or [])


def test_cancelling_an_adopted_job_suspends_it_again_and_deletes_nothing(dispatcher, fake, agents, kubectl):
    agents.start("kube-a")
    kubectl.create_namespaced_job("team-a", user_job("long", run_seconds=120.0))
    job_id = int(wait_annotated(fake, "long", ("RUNNING",))["sluice.io/job-id"])
    assert len(attempt_pods(fake, job_id, 1)) == 2
    dispatcher.client.cancel([job_id])
    wait_state(dispatcher.client, job_id, ("CANCELLED",))
    wait_until(lambda: the_job(fake, "long")["spec"]["suspend"] is True, 15, what="the Job suspended again")
    wait_until(lambda: not fake.list("pods", "team-a"), 15, what="its pods gone (the Job controller's doing)")
    job = the_job(fake, "long")
    assert fake.deletions == []  # Sluice deleted nothing: not the Job, not its pods
    assert "app.kubernetes.io/managed-by" not in job["metadata"]["labels"]  # no longer Sluice's to track
    assert job["metadata"]["annotations"]["sluice.io/adopted"] == f"{job_id}-1"  # never adopted again
    assert sluice_objects_elsewhere(fake, "long") == []
    assert wait_annotated(fake, "long", FINAL)["sluice.io/state"] == "CANCELLED"
    wait_until(lambda: "sluice.io/cancel-on-delete" not in (the_job(fake, "long")["metadata"].get("finalizers") or []),
               10, what="the finalizer off once the job ended")


def test_an_agent_killed_mid_run_picks_the_adopted_attempt_up_again(dispatcher, fake, agents, kubectl):
    first = agents.start("kube-a")
    kubectl.create_namespaced_job("team-a", user_job("train", run_seconds=8.0))
    job_id = int(wait_annotated(fake, "train", ("RUNNING",))["sluice.io/job-id"])
    before = sluice_marks(the_job(fake, "train"))
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    agents.start("kube-a")
    # The new process knows the attempt only from the cluster: a dispatch command for it must change nothing.
    dispatch_again(dispatcher, job_id, 1)
    assert sluice_marks(the_job(fake, "train")) == before
    job = wait_state(dispatcher.client, job_id, FINAL)
    assert (job["state"], job["attempt"]) == ("SUCCEEDED", 1)
    assert [e["to"] for e in dispatcher.client.describe(job_id)["events"]] == [
        "QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    assert len(attempt_pods(fake, job_id, 1)) == 2 and sluice_objects_elsewhere(fake, "train") == []
    assert fake.deletions == []


def test_a_failed_pod_fails_the_attempt_and_the_job_is_suspended_before_a_replacement_runs(dispatcher, fake, agents,
                                                                                           kubectl):
    agents.start("kube-a")
    body = user_job("flaky", run_seconds=120.0)
    body["spec"]["backoffLimit"] = 1  # the job's maxRetries; the Job controller would also replace a failed pod once
    kubectl.create_namespaced_job("team-a", body)
    job_id = int(wait_annotated(fake, "flaky", ("RUNNING",))["sluice.io/job-id"])
    failed = sorted(p["metadata"]["name"] for p in attempt_pods(fake, job_id, 1))[0]
    fake.fail_pod("team-a", failed, exit_code=3)
    wait_until(lambda: the_job(fake, "flaky")["spec"]["suspend"] is True, 15, what="the Job suspended again")
    wait_until(lambda: [p["metadata"]["name"] for p in fake.list("pods", "team-a")] == [failed], 15,
               what="the other pod and the controller's replacement gone, the failed pod kept")
    # Sluice retries it as a new attempt, which cannot adopt the Job again: a copy, in the queue's namespace.
    wait_until(lambda: len(attempt_pods(fake, job_id, 2)) == 2, 20, what="attempt 2's pods")
    assert {p["metadata"]["namespace"] for p in attempt_pods(fake, job_id, 2)} == {"ml"}
    first = dispatcher.client.describe(job_id)["attempts"][0]
    assert (first["state"], first["cluster"]) == ("FAILED", "kube-a")
    assert f"pod {failed} failed: container main exited with code 3" in first["reason"]
    made = {o["metadata"]["name"] for kind, o in fake.events("pods") if kind == "ADDED"
            and o["metadata"]["namespace"] == "team-a"}
    assert len(made) == 3  # the Job controller did replace the failed pod; the suspension stopped the replacement
    assert not [d for d in fake.deletions if d[0] == "jobs" or d[1] == "team-a"]
    assert "app.kubernetes.io/managed-by" not in the_job(fake, "flaky")["metadata"]["labels"]
    dispatcher.client.cancel([job_id])
    wait_until(lambda: not attempt_pods(fake, job_id, 2), 15, what="attempt 2's copy deleted")


# The intake (agent/backends/kubernetes/intake.py) takes in no object labelled as an attempt's, so it stops
# following a Job once adopted: a restarted agent's intake never looks at it, and its owner's deletion of it
# is not seen. It must take in an adopted Job (objects.py `adopted`); these pass once it does.


def test_deleting_an_adopted_job_cancels_its_job(dispatcher, fake, agents, kubectl):
    agents.start("kube-a")
    kubectl.create_namespaced_job("team-a", user_job("long", run_seconds=120.0))
    job_id = int(wait_annotated(fake, "long", ("RUNNING",))["sluice.io/job-id"])
    kubectl.delete_namespaced_job("long", "team-a")
    job = wait_state(dispatcher.client, job_id, FINAL, timeout=15)
    assert job["state"] == "CANCELLED" and "its Job team-a/long was deleted" in job["reason"]
    assert [a["state"] for a in dispatcher.client.describe(job_id)["attempts"]] == ["CANCELLED"]
    wait_until(lambda: fake.get("jobs", "team-a", "long") is None, 15, what="the Job gone once its job ended")
    wait_until(lambda: not fake.list("pods"), 15, what="its pods gone")


def test_an_adopted_job_mirrors_its_job_after_the_agent_restarted(dispatcher, fake, agents, kubectl):
    first = agents.start("kube-a")
    kubectl.create_namespaced_job("team-a", user_job("train", run_seconds=6.0))
    job_id = int(wait_annotated(fake, "train", ("RUNNING",))["sluice.io/job-id"])
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    agents.start("kube-a")
    assert wait_state(dispatcher.client, job_id, FINAL)["state"] == "SUCCEEDED"
    assert wait_annotated(fake, "train", FINAL, timeout=10)["sluice.io/state"] == "SUCCEEDED"
    wait_until(lambda: "sluice.io/cancel-on-delete" not in (the_job(fake, "train")["metadata"].get("finalizers") or []),
               10, what="the finalizer off once the job ended")


TEMPLATE = {"metadata": {"annotations": {RUN_SECONDS_ANNOTATION: "1"}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": "train:1", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}


def job_of_its_own(name: str, *, suspend: bool = True, annotations: dict | None = None,
                   run_seconds: float = 1.0) -> dict:
    """A Job in team-a without the queue label: the intake leaves it alone, the test submits for it."""
    template = {**TEMPLATE, "metadata": {"annotations": {RUN_SECONDS_ANNOTATION: str(run_seconds)}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "team-a", "annotations": annotations or {}},
            "spec": {"suspend": suspend, "parallelism": 1, "backoffLimit": 0, "template": template}}


def job_spec(name: str, uid: str, **pod_spec) -> JobSpec:
    """A one-pod job as the dispatcher's intake makes it for the Job team-a/`name` of kube-a (uid `uid`)."""
    template = {**TEMPLATE, "spec": {**TEMPLATE["spec"], **pod_spec}}
    document = {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name},
                "spec": {"queue": "vision", "podSets": [{"name": "job", "count": 1, "template": template}]}}
    return replace(job_from_document(document), origin=Origin("kube-a", "team-a", name, uid))


def origin_document(name: str, uid: str, **pod_spec) -> dict:
    """The document a dispatch command carries for it."""
    return job_spec(name, uid, **pod_spec).to_document()


def submit_as_from(dispatcher, name: str, uid: str) -> int:
    spec = job_spec(name, uid)
    with dispatcher.sessions.begin() as session:
        (job_id,) = submitting.submit(session, Principal("alice", "user", queues=frozenset({"vision"})), [spec])
    return job_id


def test_a_job_that_cannot_run_its_attempt_itself_gets_a_copy(dispatcher, fake, agents):
    agents.start("kube-a")
    fake.put(job_of_its_own("renamed"))  # the job names another uid: a Job created again under the same name
    started = fake.put(job_of_its_own("started", suspend=False, run_seconds=60.0))
    fake.put(job_of_its_own("again", annotations={"sluice.io/adopted": "999-1"}))
    before = {name: the_job(fake, name) for name in ("renamed", "started", "again")}
    jobs = {"renamed": submit_as_from(dispatcher, "renamed", "not-its-uid"),
            "started": submit_as_from(dispatcher, "started", started["metadata"]["uid"]),
            "again": submit_as_from(dispatcher, "again", the_job(fake, "again")["metadata"]["uid"]),
            "gone": submit_as_from(dispatcher, "gone", "never-created")}
    for name, job_id in jobs.items():
        job = wait_state(dispatcher.client, job_id, FINAL)
        assert (job["state"], job["cluster"]) == ("SUCCEEDED", "kube-a"), (name, job)
        copies = attempt_pods(fake, job_id, 1)
        assert [p["metadata"]["namespace"] for p in copies] == ["ml"], name  # the copy, as for any job
        assert not any(ref.get("kind") == "Job" for p in copies for ref in p["metadata"].get("ownerReferences") or [])
    for name, job in before.items():
        now = the_job(fake, name)
        assert now["metadata"].get("labels") == job["metadata"].get("labels"), name  # not Sluice's
        assert now["metadata"].get("annotations") == job["metadata"].get("annotations"), name
        assert now["spec"]["suspend"] == job["spec"]["suspend"], name
    assert fake.get("jobs", "team-a", "gone") is None


def test_adopting_reads_the_job_again_after_a_conflict_and_checks_the_pod_policy_in_its_namespace(fake, tmp_path):
    """The backend alone (as `sluice agent run` holds it), for what the dispatcher cannot provoke at will."""
    backend = KubernetesBackend(KubernetesSettings(kubeconfig=str(tmp_path / "kube-a.kubeconfig"), context="kube-a",
                                                   tick_s=0.05, backoff_initial_s=0.05, sync_timeout_s=5))
    statuses = []
    backend.start(statuses.append)
    try:
        backend.configure({"apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": "kube-a"},
                           "spec": {"kubernetes": {"namespaces": {"vision": "ml"}}}})
        uid = fake.put(job_of_its_own("train"))["metadata"]["uid"]
        document = origin_document("train", uid)
        # The Job changed between the agent's read and its patch (its owner, the intake): read again, adopt then.
        fake.fail(409, method="PATCH", path=r"/namespaces/team-a/jobs/train$")
        assert backend.create_attempt(5, 1, document) is True
        assert len(fake.requests_matching("PATCH", r"/namespaces/team-a/jobs/train$")) == 2
        assert the_job(fake, "train")["metadata"]["annotations"]["sluice.io/adopted"] == "5-1"
        assert backend.create_attempt(5, 1, document) is False
        # What the cluster's pod policy forbids is refused in the Job's namespace too: FAILED, the Job untouched.
        volume = [{"name": "host", "hostPath": {"path": "/etc"}}]
        sneaky = job_of_its_own("sneaky")
        sneaky["spec"]["template"] = {**sneaky["spec"]["template"],
                                      "spec": {**sneaky["spec"]["template"]["spec"], "volumes": volume}}
        created = fake.put(sneaky)
        assert backend.create_attempt(6, 1, origin_document("sneaky", created["metadata"]["uid"], volumes=volume))
        wait_until(lambda: [s.state for s in statuses if s.job_id == 6] == ["FAILED"], 5, what="job 6 FAILED")
        [refused] = [s for s in statuses if s.job_id == 6]
        assert "refused by the cluster's pod policy: pod set job: hostPath volume 'host'" in refused.reason
        now = the_job(fake, "sneaky")
        assert (now["metadata"], now["spec"]) == (created["metadata"], created["spec"])
        assert not fake.list("jobs", None, "sluice.io/job-id=6") and not attempt_pods(fake, 6, 1)
    finally:
        backend.stop()


def test_an_adopted_job_is_kept_off_the_nodes_its_dispatch_names_and_so_are_its_pods(fake, tmp_path):
    """A dispatch that names nodes to keep off (room held there for other jobs) adopts the Job with them in its
    node affinity: the API server takes the change while the Job is suspended and never started, and the Job's
    pods carry it."""
    backend = KubernetesBackend(KubernetesSettings(kubeconfig=str(tmp_path / "kube-a.kubeconfig"), context="kube-a",
                                                   tick_s=0.05, backoff_initial_s=0.05, sync_timeout_s=5))
    backend.start(lambda status: None)
    try:
        backend.configure({"apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": "kube-a"},
                           "spec": {"kubernetes": {"namespaces": {"vision": "ml"}}}})
        uid = fake.put(job_of_its_own("train"))["metadata"]["uid"]
        assert backend.create_attempt(9, 1, origin_document("train", uid), ("node-b", "node-c")) is True
        off = {"key": "metadata.name", "operator": "NotIn", "values": ["node-b", "node-c"]}
        terms = {"nodeSelectorTerms": [{"matchFields": [off]}]}
        adopted_job = the_job(fake, "train")
        assert adopted_job["metadata"]["annotations"]["sluice.io/adopted"] == "9-1"
        assert adopted_job["spec"]["suspend"] is False
        affinity = adopted_job["spec"]["template"]["spec"]["affinity"]
        assert affinity == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}
        wait_until(lambda: attempt_pods(fake, 9, 1), 5, what="the adopted Job's pod")
        (pod,) = attempt_pods(fake, 9, 1)
        assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == terms
    finally:
        backend.stop()
