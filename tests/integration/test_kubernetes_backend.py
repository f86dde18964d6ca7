"""The kubernetes backend through the real `kubernetes` client against the fake API server (tests/fakekube):
creation, names and labels, status mapping, watches (interruption, 410 relist, 429/5xx backoff), gang
timeout, refusals, orphan deletion, restarts, capacity. The fake plays scheduler and kubelet.

Tests marked `kind` run the same backend against a real cluster; they are skipped unless
SLUICE_KIND_KUBECONFIG names a kubeconfig (see docs/kubernetes-agent.md).
"""
from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from agent.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from tests.fakekube import FakeKube

NS = "vision"


def cluster_document(**kubernetes):
    spec = {"kubernetes": {"gangStartTimeout": "30s", **kubernetes}}
    if "podPolicy" in kubernetes:
        spec["podPolicy"] = spec["kubernetes"].pop("podPolicy")
    return {"apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": "k"}, "spec": spec}


def job_doc(*pod_sets, queue=NS, **spec):
    pod_sets = pod_sets or (pod_set("worker", 2), pod_set("ps", 1))
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"queue": queue, "podSets": list(pod_sets), **spec}}


def pod_set(name="worker", count=1, cpu="1", image="train:1", **pod_spec):
    return {"name": name, "count": count, "template": {"spec": {
        "containers": [{"name": "main", "image": image, "resources": {"requests": {"cpu": cpu}}}], **pod_spec}}}


class Statuses:
    def __init__(self):
        self.items = []
        self._cond = threading.Condition()

    def __call__(self, status):
        with self._cond:
            self.items.append(status)
            self._cond.notify_all()

    def of(self, job_id, attempt=1):
        with self._cond:
            return [s for s in self.items if (s.job_id, s.attempt) == (job_id, attempt)]

    def states(self, job_id, attempt=1):
        return [s.state for s in self.of(job_id, attempt)]

    def wait(self, job_id, state, attempt=1, timeout=5.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [s for s in self.items if (s.job_id, s.attempt, s.state) == (job_id, attempt, state)]
                if found:
                    return found[0]
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no {state} for job {job_id}/{attempt}; got {self.items}"
                self._cond.wait(remaining)


def wait_until(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def fake(tmp_path):
    with FakeKube() as server:
        server.add_namespace(NS)
        server.add_node("node-a", {"cpu": "8", "memory": "32Gi", "pods": "110"})
        server.add_node("node-b", {"cpu": "4", "memory": "16Gi", "pods": "110"})
        server.kubeconfig(tmp_path / "kubeconfig")
        yield server


def settings(tmp_path, **overrides):
    values = dict(kubeconfig=str(tmp_path / "kubeconfig"), context="fake", tick_s=0.05, image_pull_grace_s=0.3,
                  backoff_initial_s=0.05, backoff_max_s=0.4, request_timeout_s=5, sync_timeout_s=5)
    return KubernetesSettings(**{**values, **overrides})


@pytest.fixture
def start(fake, tmp_path):
    started = []

    def make(document=None, **overrides):
        statuses = Statuses()
        backend = KubernetesBackend(settings(tmp_path, **overrides))
        backend.start(statuses)
        backend.configure(document or cluster_document())
        started.append(backend)
        return backend, statuses
    yield make
    for backend in started:
        backend.stop()


def pods(fake, job_id, attempt=1):
    return fake.list("pods", None, f"sluice.io/job-id={job_id},sluice.io/attempt={attempt}")


def names(fake, job_id, attempt=1):
    return sorted(p["metadata"]["name"] for p in pods(fake, job_id, attempt))


def run_all(fake, job_id, attempt=1):
    for p in pods(fake, job_id, attempt):
        fake.run_pod(p["metadata"]["namespace"], p["metadata"]["name"], "node-a")


def test_creation_names_labels_and_repeats(start, fake):
    backend, _ = start()
    assert backend.create_attempt(7, 1, job_doc()) is True
    assert names(fake, 7) == ["7-1-ps-0", "7-1-worker-0", "7-1-worker-1"]
    worker = fake.get("pods", NS, "7-1-worker-1")
    assert worker["metadata"]["labels"] == {"sluice.io/job-id": "7", "sluice.io/attempt": "1",
                                            "sluice.io/pod-set": "worker", "app.kubernetes.io/managed-by": "sluice"}
    assert worker["spec"]["restartPolicy"] == "Never"
    assert backend.create_attempt(7, 1, job_doc()) is False  # the same command again: nothing to do
    # Another process (a restarted agent) gets the command again: every create answers 409, nothing is added.
    other, _ = start()
    assert other.create_attempt(7, 1, job_doc()) is False
    assert names(fake, 7) == ["7-1-ps-0", "7-1-worker-0", "7-1-worker-1"]
    assert [r.status for r in fake.requests_matching("POST", "/pods$")] == [201] * 3 + [409] * 3


@pytest.mark.parametrize("workload", ["pods", "jobs"])
def test_array_elements_pods_carry_their_index_in_env_and_labels(start, fake, workload):
    backend, statuses = start(cluster_document(workload=workload))
    own = pod_set("worker", 2, initContainers=[{"name": "fetch", "image": "fetch:1",
                                                "env": [{"name": "SLUICE_ARRAY_INDEX", "value": "mine"}]}])
    backend.create_attempt(21, 1, job_doc(own, pod_set("ps", 1), arrayId=19, arrayIndex=2))
    backend.create_attempt(22, 1, job_doc(pod_set("worker", 1)))
    created = pods(fake, 21)
    assert len(created) == 3  # made by the API server (workload pods) or its Job controller (workload jobs)
    for pod in created:
        assert {k: v for k, v in pod["metadata"]["labels"].items() if k.startswith("sluice.io/array")} == {
            "sluice.io/array-id": "19", "sluice.io/array-index": "2"}
        assert pod["spec"]["containers"][0]["env"] == [{"name": "SLUICE_ARRAY_ID", "value": "19"},
                                                       {"name": "SLUICE_ARRAY_INDEX", "value": "2"}]
        if pod["metadata"]["labels"]["sluice.io/pod-set"] == "worker":
            assert pod["spec"]["initContainers"][0]["env"] == [{"name": "SLUICE_ARRAY_INDEX", "value": "mine"},
                                                               {"name": "SLUICE_ARRAY_ID", "value": "19"}]
    for job in fake.list("jobs", NS, "sluice.io/job-id=21"):
        assert job["metadata"]["labels"]["sluice.io/array-index"] == "2"
    (plain,) = pods(fake, 22)
    assert "env" not in plain["spec"]["containers"][0] and "sluice.io/array-id" not in plain["metadata"]["labels"]
    run_all(fake, 21)
    assert statuses.wait(21, "RUNNING").state == "RUNNING"


@pytest.mark.parametrize("workload", ["pods", "jobs"])
def test_pods_of_a_dispatch_that_names_nodes_to_avoid_carry_it_to_the_api_server(start, fake, workload):
    backend, statuses = start(cluster_document(workload=workload))
    assert backend.create_attempt(26, 1, job_doc(pod_set("worker", 2)), ("node-b", "node-c")) is True
    created = pods(fake, 26)
    assert len(created) == 2  # accepted by the API server's validation, as made (or by the Job controller)
    for pod in created:
        assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                                    "values": ["node-b", "node-c"]}]}]}
    # A template whose own affinity is malformed is left as it is, for the API server to refuse: FAILED, with
    # its words (the dispatcher does not check a pod template against Kubernetes' schema).
    bad = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": 5}]}}}
    assert backend.create_attempt(27, 1, job_doc(pod_set("worker", 1, affinity=bad)), ("node-b",)) is True
    failed = statuses.wait(27, "FAILED")
    assert failed.reason.startswith("Kubernetes refused "), failed.reason


def test_running_reports_the_first_pod_s_address_and_again_when_it_changes(start, fake):
    backend, statuses = start()
    server = pod_set("server", 1)
    server["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 8888}, {"containerPort": 9000}]
    backend.create_attempt(24, 1, job_doc(server, pod_set("aa", 2)))  # "aa" sorts first, but is the second set
    backend.create_attempt(25, 1, job_doc(pod_set("shell", 1)))
    run_all(fake, 24)
    run_all(fake, 25)
    running = statuses.wait(24, "RUNNING")
    ip = fake.get("pods", NS, "24-1-server-0")["status"]["podIP"]
    assert ip and running.address == f"{ip}:8888"
    shell = statuses.wait(25, "RUNNING")
    assert shell.address == fake.get("pods", NS, "25-1-shell-0")["status"]["podIP"]  # no port declared
    fake.set_pod_ip(NS, "24-1-server-0", "")  # the IP unknown for a moment: nothing is said
    fake.set_pod_ip(NS, "24-1-server-0", "10.9.8.7")
    wait_until(lambda: len(statuses.of(24)) == 2, what="a second RUNNING report")
    assert [(s.state, s.address) for s in statuses.of(24)] == [("RUNNING", f"{ip}:8888"), ("RUNNING", "10.9.8.7:8888")]
    assert {s.job_id: s.address for s in backend.inventory()} == {24: "10.9.8.7:8888", 25: shell.address}
    fake.set_pod_ip(NS, "24-1-server-0", "fd00::7")
    wait_until(lambda: len(statuses.of(24)) == 3, what="a third RUNNING report")
    assert statuses.of(24)[-1].address == "[fd00::7]:8888"
    time.sleep(0.15)
    assert len(statuses.of(24)) == 3 and len(statuses.of(25)) == 1  # said once per address


def test_running_then_succeeded_and_capacity_follows(start, fake):
    backend, statuses = start()
    assert backend.capacity().allocatable == {"cpu": 12000, "memory": 48 * 2**30 * 1000}
    backend.create_attempt(1, 1, job_doc())
    wait_until(lambda: backend.capacity().free.get("cpu") == 12000 - 3000, what="pending pods counted")
    fake.run_pod(NS, "1-1-worker-0", "node-a")
    fake.run_pod(NS, "1-1-worker-1", "node-a")
    time.sleep(0.15)
    assert statuses.states(1) == []  # two of three pods running is not the gang
    fake.run_pod(NS, "1-1-ps-0", "node-b")
    running = statuses.wait(1, "RUNNING")
    # What its pods hold on each node, by name, as the capacity names the nodes: preemption knows where it frees room.
    assert {node: held["cpu"] for node, held in running.nodes} == {"node-a": 2000, "node-b": 1000}
    report = backend.capacity()
    assert report.free["cpu"] == 9000 and report.largest_free_node["cpu"] == 6000
    assert report.node_names == ("node-a", "node-b") and len(report.node_free) == 2
    for name in names(fake, 1):
        fake.succeed_pod(NS, name)
    statuses.wait(1, "SUCCEEDED")
    assert statuses.states(1) == ["RUNNING", "SUCCEEDED"]
    assert [(s.job_id, s.state) for s in backend.inventory()] == [(1, "SUCCEEDED")]
    wait_until(lambda: backend.capacity().free["cpu"] == 12000, what="capacity freed")


def test_failed_pod_reports_reason_and_exit_code_and_the_rest_is_deleted(start, fake):
    backend, statuses = start()
    backend.create_attempt(2, 1, job_doc())
    run_all(fake, 2)
    statuses.wait(2, "RUNNING")
    fake.fail_pod(NS, "2-1-worker-1", exit_code=3, reason="Error", message="loss is NaN")
    failed = statuses.wait(2, "FAILED")
    assert failed.reason == "pod 2-1-worker-1 failed: container main exited with code 3 (Error): loss is NaN"
    assert failed.exit_code == 3
    wait_until(lambda: names(fake, 2) == ["2-1-worker-1"], what="the gang's other pods deleted")
    assert {(d[2], d[3]) for d in fake.deletions} == {("2-1-worker-0", "Foreground"), ("2-1-ps-0", "Foreground")}
    assert [(s.state, s.exit_code) for s in backend.inventory()] == [("FAILED", 3)]


def test_image_pull_errors_fail_after_a_short_grace(start, fake):
    backend, statuses = start()
    backend.create_attempt(3, 1, job_doc(pod_set("worker", 1, image="nope:1")))
    fake.image_pull_error(NS, "3-1-worker-0", "ErrImagePull", 'failed to pull image "nope:1": not found')
    started = time.monotonic()
    failed = statuses.wait(3, "FAILED")
    assert time.monotonic() - started >= 0.25  # the grace (0.3s here): a pull may succeed on retry
    assert failed.reason == ('pod 3-1-worker-0 failed: container main cannot start: ErrImagePull: '
                             'failed to pull image "nope:1": not found')
    wait_until(lambda: names(fake, 3) == [], what="the stuck pod deleted")


def test_specs_the_api_server_rejects_fail_with_its_message_and_leave_nothing(start, fake):
    backend, statuses = start()
    second_invalid = pod_set("ps", 1)
    second_invalid["template"]["spec"]["containers"][0]["name"] = "Main_Container"
    assert backend.create_attempt(4, 1, job_doc(pod_set("worker", 2), second_invalid)) is True
    failed = statuses.wait(4, "FAILED")
    assert failed.reason.startswith('Kubernetes refused Pod 4-1-ps-0: Pod "4-1-ps-0" is invalid: '
                                    "spec.containers[0].name: Invalid value: 'Main_Container'")
    wait_until(lambda: names(fake, 4) == [], what="the valid part deleted again")
    assert [s.state for s in backend.inventory()] == ["FAILED"]


def test_templates_the_pod_policy_forbids_are_refused_before_anything_is_created(start, fake):
    backend, statuses = start(cluster_document(podPolicy={"allowHostNetwork": True, "serviceAccounts": ["trainer"]}))
    privileged = pod_set("worker", 1)
    privileged["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    backend.create_attempt(5, 1, job_doc(privileged, pod_set("ps", 1, serviceAccountName="root-ish")))
    failed = statuses.wait(5, "FAILED")
    assert failed.reason == ("refused by the cluster's pod policy: pod set worker: privileged container 'main' "
                             "(podPolicy.allowPrivileged is false); pod set ps: service account 'root-ish' "
                             "(podPolicy.serviceAccounts: trainer)")
    backend.create_attempt(6, 1, job_doc(pod_set("worker", 1, hostNetwork=True, serviceAccountName="trainer")))
    assert names(fake, 6) == ["6-1-worker-0"]
    assert fake.requests_matching("POST", "/pods$") and all(
        "/namespaces/vision/pods" in r.path for r in fake.requests_matching("POST", "/pods$"))
    assert names(fake, 5) == []


def test_gang_that_does_not_start_in_time_is_deleted_and_unschedulable(start, fake):
    backend, statuses = start(cluster_document(gangStartTimeout="1s"))
    created = time.monotonic()
    backend.create_attempt(8, 1, job_doc(pod_set("worker", 2, cpu="6")))
    fake.run_pod(NS, "8-1-worker-0", "node-a")
    fake.unschedulable(NS, "8-1-worker-1", "0/2 nodes are available: 2 Insufficient cpu.")
    verdict = statuses.wait(8, "UNSCHEDULABLE", timeout=5)
    assert 1.0 <= time.monotonic() - created < 4
    assert verdict.reason == ("the gang did not start within 1s: 1 of 2 pods running; pod 8-1-worker-1: "
                              "0/2 nodes are available: 2 Insufficient cpu.")
    wait_until(lambda: names(fake, 8) == [], what="the gang deleted")
    assert {d[3] for d in fake.deletions} == {"Foreground"}
    [event] = fake.list("events", NS)  # kubectl get events says why
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == \
        ("SluiceGangStartTimeout", "Warning", "8-1-worker-0")
    assert event["message"] == verdict.reason
    assert statuses.states(8) == ["UNSCHEDULABLE"]
    assert [(s.job_id, s.state) for s in backend.inventory()] == [(8, "UNSCHEDULABLE")]


def test_watch_interruption_and_relist_after_410_lose_no_change(start, fake):
    backend, statuses = start()
    backend.create_attempt(9, 1, job_doc(pod_set("worker", 2)))
    fake.fail(503, method="GET", path="/api/v1/pods$", watch=True, times=3)  # the next watches fail
    fake.break_watches()
    run_all(fake, 9)  # changes while no pod watch is open
    fake.compact()  # ... and the history they would resume from is gone: 410 Gone, then a fresh list
    statuses.wait(9, "RUNNING")
    assert backend.stats["pods.expired"] >= 1 and backend.stats["pods.lists"] >= 2
    assert backend.stats["pods.backoffs"] >= 3
    watches = [r for r in fake.requests_matching("GET", "/api/v1/pods$") if r.watch]
    assert [r.status for r in watches].count(503) == 3
    # Every watch resumes from a resourceVersion (never from "now", which would skip changes).
    assert all(r.query.get("resourceVersion") for r in watches)
    relists = [r for r in fake.requests_matching("GET", "/api/v1/pods$") if not r.watch]
    assert len(relists) >= 2


def test_429_and_5xx_are_retried_with_backoff(start, fake):
    backend, _ = start()
    fake.fail(429, method="POST", path="/pods$", times=2, retry_after=0)
    fake.fail(500, method="POST", path="/pods$", times=1)
    assert backend.create_attempt(10, 1, job_doc(pod_set("worker", 1))) is True
    posts = fake.requests_matching("POST", "/pods$")
    assert [r.status for r in posts] == [429, 429, 500, 201]
    assert posts[3].at - posts[2].at >= 0.03  # backed off before trying again
    assert backend.stats["backoffs"] == 3
    # Past the attempts allowed per call the command fails (it is not acked and comes again later).
    fake.fail(503, method="POST", path="/pods$", times=10)
    with pytest.raises(Exception, match="503"):
        backend.create_attempt(11, 1, job_doc(pod_set("worker", 1)))
    fake.clear_faults()
    assert backend.create_attempt(11, 1, job_doc(pod_set("worker", 1))) is True  # the re-sent command
    assert names(fake, 11) == ["11-1-worker-0"]
    # A watch answered 429 waits as long as Retry-After says, then resumes where it was.
    fake.reset_requests()
    fake.fail(429, method="GET", path="/api/v1/nodes$", watch=True, times=1, retry_after=1)
    fake.break_watches()
    fake.add_node("node-c", {"cpu": "2", "memory": "8Gi"})
    wait_until(lambda: backend.capacity().allocatable.get("cpu") == 14000, what="the node watch back")
    throttled, resumed = [r for r in fake.requests_matching("GET", "/api/v1/nodes$") if r.watch][:2]
    assert throttled.status == 429 and resumed.status == 200
    assert resumed.at - throttled.at >= 0.95
    assert resumed.query["resourceVersion"] == throttled.query["resourceVersion"]


def test_cancel_deletes_foreground_and_reports_nothing_more(start, fake):
    backend, statuses = start()
    backend.create_attempt(12, 1, job_doc())
    run_all(fake, 12)
    statuses.wait(12, "RUNNING")
    backend.delete_attempt(12, 1)
    wait_until(lambda: names(fake, 12) == [], what="pods deleted")
    assert {(d[2], d[3]) for d in fake.deletions} == {("12-1-ps-0", "Foreground"), ("12-1-worker-0", "Foreground"),
                                                      ("12-1-worker-1", "Foreground")}
    time.sleep(0.2)
    assert statuses.states(12) == ["RUNNING"]
    assert backend.inventory() == []
    assert backend.create_attempt(12, 1, job_doc()) is False  # a late repeat of the dispatch creates nothing
    backend.delete_attempt(99, 1)  # absent: no error


def test_objects_deleted_outside_sluice_are_lost(start, fake):
    backend, statuses = start()
    backend.create_attempt(13, 1, job_doc(pod_set("worker", 2)))
    run_all(fake, 13)
    statuses.wait(13, "RUNNING")
    fake.delete("pods", NS, "13-1-worker-0")  # kubectl delete pod
    lost = statuses.wait(13, "LOST")
    assert lost.reason == "13-1-worker-0 deleted outside Sluice"
    wait_until(lambda: names(fake, 13) == [], what="the rest of the gang deleted")


def test_agent_restart_mid_job_creates_nothing_twice_and_loses_no_status(start, fake):
    first, statuses = start()
    first.create_attempt(14, 1, job_doc())
    run_all(fake, 14)
    statuses.wait(14, "RUNNING")
    first.stop()
    for name in names(fake, 14):  # the job finishes while no agent runs
        fake.succeed_pod(NS, name)
    second, after = start()
    assert [(s.job_id, s.state) for s in second.inventory()] == [(14, "SUCCEEDED")]  # straight from the cluster
    after.wait(14, "SUCCEEDED")
    assert second.create_attempt(14, 1, job_doc()) is False  # the re-sent dispatch
    assert len(names(fake, 14)) == 3
    assert [r.status for r in fake.requests_matching("POST", "/pods$")] == [201] * 3 + [409] * 3


def test_reports_carry_the_times_the_cluster_shows_not_when_the_agent_looked(start, fake):
    # The kubelet's times (whole seconds): the gang ran from its last pod's start; the attempt ended at
    # its last pod's end, while no agent ran, and the restarted agent says when, not when it found out.
    now = datetime.now(UTC).replace(microsecond=0)
    first, statuses = start()
    first.create_attempt(20, 1, job_doc(pod_set("worker", 2)))
    fake.run_pod(NS, "20-1-worker-0", "node-a", at=now - timedelta(hours=3, minutes=1))
    fake.run_pod(NS, "20-1-worker-1", "node-a", at=now - timedelta(hours=3))
    assert statuses.wait(20, "RUNNING").at == (now - timedelta(hours=3)).timestamp()
    first.stop()
    fake.succeed_pod(NS, "20-1-worker-0", at=now - timedelta(hours=2))
    fake.succeed_pod(NS, "20-1-worker-1", at=now - timedelta(hours=2, minutes=5))
    second, after = start()
    assert [(s.state, s.at) for s in second.inventory()] == [("SUCCEEDED", (now - timedelta(hours=2)).timestamp())]
    assert after.wait(20, "SUCCEEDED").at == (now - timedelta(hours=2)).timestamp()

    second.create_attempt(21, 1, job_doc(pod_set("worker", 1)))
    fake.run_pod(NS, "21-1-worker-0", "node-a", at=now - timedelta(minutes=30))
    after.wait(21, "RUNNING")
    fake.fail_pod(NS, "21-1-worker-0", exit_code=2, at=now - timedelta(minutes=10))
    assert after.wait(21, "FAILED").at == (now - timedelta(minutes=10)).timestamp()


def test_gang_clock_survives_an_agent_restart(start, fake):
    first, _ = start(cluster_document(gangStartTimeout="2s"))
    created = time.monotonic()
    first.create_attempt(15, 1, job_doc(pod_set("worker", 2)))
    first.stop()
    time.sleep(0.5)
    _, statuses = start(cluster_document(gangStartTimeout="2s"))
    statuses.wait(15, "UNSCHEDULABLE", timeout=8)
    assert 2.0 <= time.monotonic() - created < 4.5  # from the creation, not from the restart (2.5s at least)


def test_jobs_workload_runs_a_gang_of_jobs(start, fake):
    backend, statuses = start(cluster_document(workload="jobs"))
    assert backend.create_attempt(16, 1, job_doc()) is True
    assert sorted(j["metadata"]["name"] for j in fake.list("jobs", NS)) == ["16-1-ps", "16-1-worker"]
    # Each Job runs its pods once, together; a failed pod is never replaced (Sluice retries the attempt).
    assert {j["metadata"]["name"]: (j["spec"]["parallelism"], j["spec"]["completions"], j["spec"]["backoffLimit"])
            for j in fake.list("jobs", NS)} == {"16-1-ps": (1, 1, 0), "16-1-worker": (2, 2, 0)}
    assert len(pods(fake, 16)) == 3  # made by the Job controller, labelled from the template
    assert backend.create_attempt(16, 1, job_doc()) is False
    run_all(fake, 16)
    statuses.wait(16, "RUNNING")
    for p in pods(fake, 16):
        fake.succeed_pod(NS, p["metadata"]["name"])
    statuses.wait(16, "SUCCEEDED")
    backend.create_attempt(17, 1, job_doc())
    run_all(fake, 17)
    statuses.wait(17, "RUNNING")
    backend.delete_attempt(17, 1)
    # Jobs only (their pods go with them, foreground); a delete may repeat while the watch catches up.
    assert {(d[0], d[2], d[3]) for d in fake.deletions} == {("jobs", "17-1-ps", "Foreground"),
                                                            ("jobs", "17-1-worker", "Foreground")}
    wait_until(lambda: not fake.list("jobs", NS, "sluice.io/job-id=17") and not pods(fake, 17), what="jobs gone")


def test_namespaces_are_created_only_when_the_cluster_allows(start, fake):
    backend, statuses = start(cluster_document(namespaces={"nlp": "team-nlp"}))
    backend.create_attempt(18, 1, job_doc(pod_set("worker", 1), queue="nlp"))
    failed = statuses.wait(18, "FAILED")
    assert failed.reason == ("namespace team-nlp does not exist, and this cluster does not create namespaces "
                             "(spec.kubernetes.createNamespaces)")
    backend.configure(cluster_document(namespaces={"nlp": "team-nlp"}, createNamespaces=True))
    backend.create_attempt(19, 1, job_doc(pod_set("worker", 1), queue="nlp"))
    assert fake.get("namespaces", "", "team-nlp")["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "sluice"}
    assert names(fake, 19) == ["19-1-worker-0"] and pods(fake, 19)[0]["metadata"]["namespace"] == "team-nlp"


def test_final_attempts_are_removed_after_their_retention(start, fake):
    backend, statuses = start(final_retention_s=0.3)
    backend.create_attempt(20, 1, job_doc(pod_set("worker", 1)))
    run_all(fake, 20)
    fake.succeed_pod(NS, "20-1-worker-0")
    statuses.wait(20, "SUCCEEDED")
    wait_until(lambda: names(fake, 20) == [], what="retention")
    time.sleep(0.1)
    assert statuses.states(20) == ["RUNNING", "SUCCEEDED"] or statuses.states(20) == ["SUCCEEDED"]


def test_capacity_report_tracks_nodes_and_every_pod(start, fake):
    backend, _ = start()
    other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-else", "namespace": NS},
             "spec": {"containers": [{"name": "m", "image": "x",
                                      "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]}}
    fake.put(other)
    fake.run_pod(NS, "someone-else", "node-b")
    wait_until(lambda: backend.capacity().free.get("cpu") == 10000, what="a pod Sluice did not make counted")
    report = backend.capacity()
    assert report.largest_free_node == {"cpu": 8000, "memory": 32 * 2**30 * 1000}
    assert report.free["memory"] == (48 - 1) * 2**30 * 1000
    fake.set_node("node-a", unschedulable=True)
    wait_until(lambda: backend.capacity().allocatable.get("cpu") == 4000, what="a cordoned node left out")
    assert backend.capacity().largest_free_node["cpu"] == 2000


@pytest.mark.kind
@pytest.mark.skipif(not os.environ.get("SLUICE_KIND_KUBECONFIG"), reason="needs a kind cluster: SLUICE_KIND_KUBECONFIG")
def test_on_a_real_cluster_a_gang_runs_to_success():
    """Against kind: a two-pod-set gang of busybox pods runs and succeeds; see docs/kubernetes-agent.md."""
    statuses = Statuses()
    backend = KubernetesBackend(KubernetesSettings(kubeconfig=os.environ["SLUICE_KIND_KUBECONFIG"],
                                                   context=os.environ.get("SLUICE_KIND_CONTEXT"), tick_s=0.5))
    backend.start(statuses)
    backend.configure(cluster_document(namespaces={NS: "default"}, gangStartTimeout="3m"))
    job_id = int(time.time()) % 1_000_000
    sleeper = {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 3"],
                               "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    try:
        backend.create_attempt(job_id, 1, job_doc({"name": "a", "count": 2, "template": {"spec": sleeper}},
                                                  {"name": "b", "count": 1, "template": {"spec": sleeper}}))
        statuses.wait(job_id, "RUNNING", timeout=180)
        statuses.wait(job_id, "SUCCEEDED", timeout=60)
        assert backend.capacity().allocatable.get("cpu", 0) > 0
    finally:
        backend.delete_attempt(job_id, 1)
        backend.stop()
