"""A real dispatcher (embedded Postgres, real gRPC) and `sluice agent run --backend kubernetes` processes
driving fake API servers through the real `kubernetes` client: a gang job from QUEUED to SUCCEEDED, an
agent killed (-9) and restarted mid-run, orphans deleted once the dispatcher confirms, and a gang that
cannot start reported UNSCHEDULABLE and run again as attempt 2 on another cluster."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import pytest

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice.client import Client, ClientError
from sluice.config import ClientConfig
from sluice.objects import load_objects
from tests.fakekube import RUN_SECONDS_ANNOTATION, FakeKube
from tests.integration.test_cli import REPO, base_env

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
  site: dc-1
  kubernetes: {namespaces: {vision: ml-vision}, gangStartTimeout: 2s}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: kube-b}
spec:
  tier: onprem
  site: dc-2
  kubernetes: {gangStartTimeout: 2s}
"""
NAMESPACES = {"kube-a": "ml-vision", "kube-b": "vision"}
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def gang_doc(run_seconds: float, max_retries: int = 2) -> dict:
    def pod_set(name, count):
        return {"name": name, "count": count, "template": {
            "metadata": {"annotations": {RUN_SECONDS_ANNOTATION: str(run_seconds)}},
            "spec": {"containers": [{"name": "main", "image": "train:1",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "gang"},
            "spec": {"queue": "vision", "maxRetries": max_retries,
                     "podSets": [pod_set("worker", 2), pod_set("ps", 1)]}}


@pytest.fixture
def fakes(tmp_path):
    servers = {}
    for cluster, namespace in NAMESPACES.items():
        server = FakeKube().start()
        server.add_namespace(namespace)
        server.add_node("node-0", {"cpu": "8", "memory": "32Gi", "pods": "110"})
        server.add_node("node-1", {"cpu": "8", "memory": "32Gi", "pods": "110"})
        server.kubeconfig(tmp_path / f"{cluster}.kubeconfig", context=cluster)
        server.autopilot()
        servers[cluster] = server
    yield servers
    for server in servers.values():
        server.stop()


@contextlib.contextmanager
def running_dispatcher(db_url: str, tmp_path, objects: str, clusters):
    """A dispatcher with `objects` applied, an admin's client, and each cluster's agent token written to
    tmp_path/CLUSTER.token (where Agents reads it)."""
    from dispatcher.store import clusters as cluster_store
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(objects))
        d.admin = tokens.create(session, "admin", "admin")
        for cluster in clusters:
            (tmp_path / f"{cluster}.token").write_text(tokens.create(session, "agent", f"agent-{cluster}", cluster))
    d.client = Client(ClientConfig(d.address, d.admin, timeout_s=10, insecure=True))
    try:
        yield d
    finally:
        d.client.close()
        d.stop()


@contextlib.contextmanager
def kube_api(tmp_path, context: str, api):
    """One of the official client's APIs (`kubernetes.client.BatchV1Api`, ...) on a fake API server, as a user's
    kubectl would call it: the kubeconfig FakeKube.kubeconfig wrote to tmp_path/CONTEXT.kubeconfig."""
    from kubernetes import config as kube_config
    api_client = kube_config.new_client_from_config(str(tmp_path / f"{context}.kubeconfig"), context=context)
    try:
        yield api(api_client)
    finally:
        api_client.close()


@pytest.fixture
def dispatcher(db_url, tmp_path):
    with running_dispatcher(db_url, tmp_path, OBJECTS, NAMESPACES) as d:
        yield d


class Agents:
    """`sluice agent run --backend kubernetes` processes, one per cluster at a time."""

    def __init__(self, dispatcher, tmp_path):
        self.dispatcher, self.tmp_path = dispatcher, tmp_path
        self.env = base_env(tmp_path)
        self.procs: list[subprocess.Popen] = []

    def start(self, cluster: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluice", "agent", "run", "--cluster", cluster, "--dispatcher",
             self.dispatcher.address, "--token-file", str(self.tmp_path / f"{cluster}.token"),
             "--backend", "kubernetes", "--kubeconfig", str(self.tmp_path / f"{cluster}.kubeconfig"),
             "--context", cluster, "--metrics-listen", "", "--insecure"],
            env=self.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        wait_until(lambda: _reachable(self.dispatcher.client, cluster), timeout=30,
                   what=f"{cluster}'s agent connected", proc=proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def agents(dispatcher, fakes, tmp_path):
    launcher = Agents(dispatcher, tmp_path)
    yield launcher
    launcher.stop_all()


def _reachable(client, cluster):
    shown = {c["name"]: c for c in client.clusters()}[cluster]
    return shown["capacitySource"] == "agent" and shown["state"] == "active"


def wait_until(predicate, timeout=20.0, what="condition", proc=None):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the agent exited ({proc.returncode}): {proc.stderr.read()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_state(client, job_id, states, timeout=30.0):
    job = {}
    wait_until(lambda: (job.update(client.get(job_id)) or job["state"] in states), timeout,
               what=f"job {job_id} in {states} (it is {job.get('state')}: {job.get('reason')})")
    return job


def attempt_pods(fake, job_id, attempt):
    return fake.list("pods", None, f"sluice.io/job-id={job_id},sluice.io/attempt={attempt}")


def test_a_gang_job_runs_queued_to_succeeded_through_dispatcher_and_kubernetes_agent(dispatcher, fakes, agents):
    agents.start("kube-a")
    client = dispatcher.client
    [cluster] = [c for c in client.clusters() if c["name"] == "kube-a"]
    # The agent's capacity report: two Ready nodes of 8 cpu and 32Gi, nothing running yet.
    assert cluster["allocatable"] == cluster["free"] == {"cpu": "16", "memory": "64Gi"}
    assert cluster["largestFreeNode"] == {"cpu": "8", "memory": "32Gi"}
    [job_id] = client.submit([gang_doc(run_seconds=1.0)])
    job = wait_state(client, job_id, FINAL)
    assert (job["state"], job["cluster"], job["attempt"]) == ("SUCCEEDED", "kube-a", 1), job
    assert [e["to"] for e in client.describe(job_id)["events"]] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    pods = attempt_pods(fakes["kube-a"], job_id, 1)
    # The namespace came from the Cluster object the dispatcher sent in its Welcome.
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods) == [
        ("ml-vision", f"{job_id}-1-ps-0"), ("ml-vision", f"{job_id}-1-worker-0"), ("ml-vision", f"{job_id}-1-worker-1")]
    assert all(p["status"]["phase"] == "Succeeded" for p in pods)
    assert {p["metadata"]["labels"]["app.kubernetes.io/managed-by"] for p in pods} == {"sluice"}
    assert not attempt_pods(fakes["kube-b"], job_id, 1)


def test_killing_and_restarting_the_agent_mid_run_duplicates_nothing_and_loses_no_status(dispatcher, fakes, agents):
    fake = fakes["kube-a"]
    first = agents.start("kube-a")
    client = dispatcher.client
    [job_id] = client.submit([gang_doc(run_seconds=3.0)])
    wait_state(client, job_id, ("RUNNING",) + FINAL)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # While no agent runs: the gang finishes, and an object of a stale attempt of the same job appears (say,
    # left by an agent that died before it deleted it): the dispatcher must confirm it is an orphan.
    wait_until(lambda: all(p["status"]["phase"] == "Succeeded" for p in attempt_pods(fake, job_id, 1)),
               timeout=15, what="the gang to finish")
    fake.autopilot(False)
    fake.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{job_id}-9-worker-0", "namespace": "ml-vision",
        "labels": {"sluice.io/job-id": str(job_id), "sluice.io/attempt": "9", "sluice.io/pod-set": "worker",
                   "app.kubernetes.io/managed-by": "sluice"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "train:1"}]}})
    assert client.get(job_id)["state"] == "RUNNING"
    agents.start("kube-a")
    job = wait_state(client, job_id, FINAL)
    assert (job["state"], job["attempt"], job["cluster"]) == ("SUCCEEDED", 1, "kube-a"), job
    assert [e["to"] for e in client.describe(job_id)["events"]] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    assert len(attempt_pods(fake, job_id, 1)) == 3
    created = [r.status for r in fake.requests_matching("POST", "/namespaces/ml-vision/pods$")]
    assert created.count(201) == 3 and set(created) <= {201, 409}, created
    wait_until(lambda: fake.get("pods", "ml-vision", f"{job_id}-9-worker-0") is None, timeout=10,
               what="the orphan deleted")
    assert ("pods", "ml-vision", f"{job_id}-9-worker-0", "Foreground") in fake.deletions


def test_a_gang_that_cannot_start_is_unschedulable_and_runs_again_as_attempt_2_elsewhere(dispatcher, fakes, agents):
    fakes["kube-a"].autopilot(False)  # kube-a's scheduler never binds the pods: the gang cannot start there
    agents.start("kube-a")
    client = dispatcher.client
    [job_id] = client.submit([gang_doc(run_seconds=0.5)])
    first = wait_state(client, job_id, ("DISPATCHED", "RUNNING") + FINAL)
    assert (first["cluster"], first["attempt"]) == ("kube-a", 1)
    agents.start("kube-b")
    job = wait_state(client, job_id, FINAL, timeout=40)
    assert (job["state"], job["attempt"]) == ("SUCCEEDED", 2), job
    # The dispatcher leaves a cluster where an attempt could not start out for a while
    # (dispatcher/scheduler/ avoid_unschedulable_s), so attempt 2 went to the other cluster.
    assert job["cluster"] == "kube-b"
    events = client.describe(job_id)["events"]
    requeued = [e for e in events if e["to"] == "QUEUED"][1]
    assert "attempt 1 could not be scheduled on kube-a" in requeued["reason"]
    assert "the gang did not start within 2s: 0 of 3 pods running" in requeued["reason"]
    assert attempt_pods(fakes["kube-a"], job_id, 1) == []  # deleted when the agent gave up the gang
    assert {d[3] for d in fakes["kube-a"].deletions} == {"Foreground"}
    assert len(attempt_pods(fakes["kube-b"], job_id, 2)) == 3


def test_agent_run_kubernetes_refuses_a_bad_connection_config(tmp_path):
    from tests.integration.test_cli import run_sluice
    env = base_env(tmp_path)  # a home with no ~/.kube/config, and not inside a pod
    (tmp_path / "t").write_text("x")
    common = ("agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1", "--token-file", str(tmp_path / "t"))
    missing = run_sluice(env, *common, "--backend", "kubernetes")
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: agent run --backend kubernetes: cannot load the default kubeconfig")
    (tmp_path / "kc").write_text('{"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []}')
    context = run_sluice(env, *common, "--backend", "kubernetes", "--kubeconfig", str(tmp_path / "kc"),
                         "--context", "x")
    assert context.returncode == 1 and (
        f"error: agent run --backend kubernetes: cannot load {tmp_path / 'kc'}" in context.stderr)
    sim = run_sluice(env, *common, "--context", "x")
    assert sim.returncode == 2 and "--kubeconfig and --context are for --backend kubernetes" in sim.stderr


def test_logs_of_a_running_then_finished_job_and_of_a_frozen_agent(dispatcher, fakes, agents):
    """`sluice logs` end to end: the dispatcher asks the agent process over its link, the kubernetes backend
    reads the pods' log endpoint of the (fake) API server."""
    proc = agents.start("kube-a")
    client, fake = dispatcher.client, fakes["kube-a"]
    [job_id] = client.submit([gang_doc(run_seconds=3.0)])
    wait_state(client, job_id, ("RUNNING",))
    worker = f"{job_id}-1-worker-0"
    fake.append_log("ml-vision", worker, "epoch 1 loss 0.52")
    running = list(client.logs(job_id, pod=worker))
    assert [line["line"] for line in running][-1] == "epoch 1 loss 0.52"
    assert {(line["cluster"], line["attempt"]) for line in running} == {("kube-a", 1)}
    followed = list(client.logs(job_id, pod_set="worker", follow=True))  # ends when both workers have ended
    assert {line["pod"] for line in followed} == {worker, f"{job_id}-1-worker-1"}
    assert [line["line"] for line in followed if line["pod"] == worker][-1] == "exited with code 0"
    wait_state(client, job_id, FINAL)
    finished = list(client.logs(job_id, tail=1))
    assert sorted(line["pod"] for line in finished) == [f"{job_id}-1-ps-0", worker, f"{job_id}-1-worker-1"]
    # A frozen agent (its link still up) answers nothing: the call ends with a clear error within seconds.
    proc.send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        with pytest.raises(ClientError) as err:
            list(client.logs(job_id))
        assert err.value.code == "UNAVAILABLE" and "did not answer" in str(err.value), err.value
        assert time.monotonic() - began < 15
    finally:
        proc.send_signal(signal.SIGCONT)


def test_a_job_whose_template_the_api_server_refuses_fails_and_the_jobs_after_it_still_run(dispatcher, fakes, agents):
    """`sluice submit` checks of a pod template only what Sluice needs and passes the rest through. A template the
    agent cannot make sense of (volumes that are no list) fails its job with the API server's words; it once made
    the agent fail the dispatch command, each time it came again, and no job after it reached the cluster."""
    agents.start("kube-a")
    client = dispatcher.client
    bad = gang_doc(run_seconds=0.2, max_retries=0)
    bad["spec"]["podSets"] = [bad["spec"]["podSets"][0]]
    bad["spec"]["podSets"][0]["template"]["spec"]["volumes"] = 5
    [bad_id] = client.submit([bad])
    failed = wait_state(client, bad_id, FINAL)
    assert (failed["state"], failed["cluster"]) == ("FAILED", "kube-a"), failed
    assert "Kubernetes refused Pod" in failed["reason"], failed["reason"]
    [good_id] = client.submit([gang_doc(run_seconds=0.2)])
    good = wait_state(client, good_id, FINAL)
    assert (good["state"], good["cluster"]) == ("SUCCEEDED", "kube-a"), good
