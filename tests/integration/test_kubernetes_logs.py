"""Pod logs: the kubernetes backend's `logs` through the real `kubernetes` client against the fake API server
(tests/fakekube), and the fake's log endpoint itself. The fake's pods log "started" and "exited with code N";
the tests write the lines in between."""
from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes import client, config

from agent.backends.base import LogsGone
from agent.backends.kubernetes.api import KubeError
from tests.integration.test_kubernetes_backend import (  # noqa: F401 - fake and start are fixtures
    NS,
    cluster_document,
    fake,
    job_doc,
    names,
    pod_set,
    pods,
    run_all,
    start,
    wait_until,
)


def two_containers(name="duo", count=1):
    template = pod_set(name, count)
    template["template"]["spec"]["containers"].append({"name": "sidecar", "image": "proxy:1"})
    return template


class Follower:
    """Iterates a follow in a thread, so the test can act on the cluster meanwhile."""

    def __init__(self, lines):
        self.lines: list[tuple[str, str]] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(lines,), daemon=True)
        self._thread.start()

    def _run(self, lines):
        try:
            for item in lines:
                self.lines.append(item)
        except BaseException as exc:  # the test asserts on it
            self.error = exc

    def wait_for(self, item, timeout=3.0):
        wait_until(lambda: item in self.lines, timeout, f"{item} followed")

    def ended(self, timeout=3.0) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


def test_logs_of_a_running_attempt_with_two_pod_sets_in_pod_name_order(start, fake):
    backend, statuses = start()
    backend.create_attempt(12, 1, job_doc())  # worker x2, ps x1
    run_all(fake, 12)
    statuses.wait(12, "RUNNING")
    for name in names(fake, 12):
        fake.append_log(NS, name, f"hello from {name}\nstep 1")
    assert list(backend.logs(12, 1)) == [
        (name, line) for name in ("12-1-ps-0", "12-1-worker-0", "12-1-worker-1")
        for line in ("started", f"hello from {name}", "step 1")]
    assert list(backend.logs(12, 1, tail_lines=1)) == [
        ("12-1-ps-0", "step 1"), ("12-1-worker-0", "step 1"), ("12-1-worker-1", "step 1")]
    assert list(backend.logs(12, 1, pod="12-1-worker-1", tail_lines=2)) == [
        ("12-1-worker-1", "hello from 12-1-worker-1"), ("12-1-worker-1", "step 1")]
    assert [pod for pod, _ in backend.logs(12, 1, pod_set="worker")] == ["12-1-worker-0"] * 3 + ["12-1-worker-1"] * 3
    assert list(backend.logs(12, 1, pod_set="ps", pod="12-1-ps-0", tail_lines=1)) == [("12-1-ps-0", "step 1")]
    # Each container is read with its name and tailLines, within the request timeout (never a hang).
    reads = fake.requests_matching("GET", "/pods/12-1-worker-1/log$")
    assert [r.query for r in reads] == [{"container": "main"}, {"container": "main", "tailLines": "1"},
                                        {"container": "main", "tailLines": "2"}, {"container": "main"}]


def test_logs_of_a_finished_attempt_are_still_there_and_a_pending_pod_has_none_yet(start, fake):
    backend, statuses = start()
    backend.create_attempt(13, 1, job_doc(pod_set("worker", 2)))
    run_all(fake, 13)
    statuses.wait(13, "RUNNING")
    fake.append_log(NS, "13-1-worker-0", "done")
    fake.succeed_pod(NS, "13-1-worker-0")
    fake.fail_pod(NS, "13-1-worker-1", exit_code=3)
    statuses.wait(13, "FAILED")
    assert list(backend.logs(13, 1)) == [("13-1-worker-0", "started"), ("13-1-worker-0", "done"),
                                         ("13-1-worker-0", "exited with code 0"), ("13-1-worker-1", "started"),
                                         ("13-1-worker-1", "exited with code 3")]
    backend.create_attempt(14, 1, job_doc(pod_set("worker", 2)))
    fake.run_pod(NS, "14-1-worker-1")
    assert list(backend.logs(14, 1)) == [("14-1-worker-1", "started")]  # worker-0 is still Pending


def test_logs_gone_for_a_wrong_name_and_after_the_attempt_is_deleted(start, fake):
    backend, statuses = start()
    backend.create_attempt(15, 1, job_doc())
    run_all(fake, 15)
    statuses.wait(15, "RUNNING")
    with pytest.raises(LogsGone) as info:
        backend.logs(15, 1, pod="15-1-worker-7")
    assert str(info.value) == "no pod named 15-1-worker-7 in job 15 attempt 1; its pods: 15-1-ps-0, 15-1-worker-0, " \
                              "15-1-worker-1"
    with pytest.raises(LogsGone) as info:
        backend.logs(15, 1, pod_set="evaluator")
    assert str(info.value) == "no pod set evaluator in job 15 attempt 1; its pod sets: ps, worker"
    with pytest.raises(LogsGone) as info:
        backend.logs(15, 1, pod_set="ps", pod="15-1-worker-0")
    assert str(info.value) == "no pod named 15-1-worker-0 in pod set ps of job 15 attempt 1; its pods: 15-1-ps-0"
    with pytest.raises(LogsGone) as info:
        backend.logs(15, 2)
    assert str(info.value) == "the cluster holds no pods of job 15 attempt 2 (deleted, or never created)"
    backend.delete_attempt(15, 1)
    wait_until(lambda: names(fake, 15) == [], what="pods deleted")
    with pytest.raises(LogsGone, match="the cluster holds no pods of job 15 attempt 1"):
        backend.logs(15, 1, follow=True)


def test_follow_sees_lines_as_they_come_and_ends_when_the_pod_succeeds(start, fake):
    backend, statuses = start()
    backend.create_attempt(16, 1, job_doc(pod_set("worker", 1)))
    run_all(fake, 16)
    fake.append_log(NS, "16-1-worker-0", "epoch 1")
    follower = Follower(backend.logs(16, 1, follow=True))
    follower.wait_for(("16-1-worker-0", "epoch 1"))
    fake.append_log(NS, "16-1-worker-0", "epoch 2")
    follower.wait_for(("16-1-worker-0", "epoch 2"))
    assert not follower.ended(0.1)
    fake.append_log(NS, "16-1-worker-0", "epoch 3")
    fake.succeed_pod(NS, "16-1-worker-0")
    assert follower.ended()
    assert follower.error is None
    assert [line for _, line in follower.lines] == ["started", "epoch 1", "epoch 2", "epoch 3", "exited with code 0"]
    assert fake.requests_matching("GET", "/pods/16-1-worker-0/log$")[-1].query == {"container": "main",
                                                                                  "follow": "true"}


def test_follow_of_several_pods_waits_for_pending_ones_and_keeps_each_pods_order(start, fake):
    backend, _ = start(log_poll_s=0.05)
    backend.create_attempt(17, 1, job_doc(pod_set("worker", 2)))
    fake.run_pod(NS, "17-1-worker-0")
    follower = Follower(backend.logs(17, 1, follow=True, tail_lines=1))
    follower.wait_for(("17-1-worker-0", "started"))
    fake.run_pod(NS, "17-1-worker-1")  # was Pending when the follow began
    follower.wait_for(("17-1-worker-1", "started"))
    for i in range(5):
        fake.append_log(NS, "17-1-worker-0", f"a{i}")
        fake.append_log(NS, "17-1-worker-1", f"b{i}")
    follower.wait_for(("17-1-worker-1", "b4"))
    fake.succeed_pod(NS, "17-1-worker-0")
    time.sleep(0.1)
    assert not follower.ended(0.05)  # one pod still runs
    fake.fail_pod(NS, "17-1-worker-1", exit_code=2)
    assert follower.ended()
    assert follower.error is None
    assert [line for pod, line in follower.lines if pod == "17-1-worker-0"] == [
        "started", "a0", "a1", "a2", "a3", "a4", "exited with code 0"]
    assert [line for pod, line in follower.lines if pod == "17-1-worker-1"] == [
        "started", "b0", "b1", "b2", "b3", "b4", "exited with code 2"]


def test_follow_ends_when_stopped_and_when_the_pods_are_deleted(start, fake):
    backend, statuses = start()
    backend.create_attempt(18, 1, job_doc(pod_set("worker", 2)))
    run_all(fake, 18)
    statuses.wait(18, "RUNNING")
    stopped = threading.Event()
    follower = Follower(backend.logs(18, 1, follow=True, stopped=stopped))
    follower.wait_for(("18-1-worker-1", "started"))
    began = time.monotonic()
    stopped.set()
    assert follower.ended(1.0) and time.monotonic() - began < 1.0
    assert follower.error is None
    # Deleting the attempt ends a follow too (the pods go).
    follower = Follower(backend.logs(18, 1, follow=True))
    follower.wait_for(("18-1-worker-0", "started"))
    backend.delete_attempt(18, 1)
    assert follower.ended()
    assert follower.error is None
    # So does stopping the backend (the agent stops), quietly, even for a pod that has not started.
    other, _ = start(log_poll_s=0.05)
    other.create_attempt(22, 1, job_doc(pod_set("worker", 2)))
    fake.run_pod(NS, "22-1-worker-0")
    follower = Follower(other.logs(22, 1, follow=True))
    follower.wait_for(("22-1-worker-0", "started"))
    other.stop()
    assert follower.ended(1.0)
    assert follower.error is None


def test_pods_of_several_containers_prefix_each_line_with_its_container(start, fake):
    backend, statuses = start()
    backend.create_attempt(19, 1, job_doc(two_containers()))
    run_all(fake, 19)
    fake.append_log(NS, "19-1-duo-0", "serving", container="sidecar")
    fake.append_log(NS, "19-1-duo-0", "training")
    assert list(backend.logs(19, 1)) == [("19-1-duo-0", "[main] started"), ("19-1-duo-0", "[main] training"),
                                         ("19-1-duo-0", "[sidecar] started"), ("19-1-duo-0", "[sidecar] serving")]
    follower = Follower(backend.logs(19, 1, follow=True, tail_lines=1))
    follower.wait_for(("19-1-duo-0", "[sidecar] serving"))
    fake.succeed_pod(NS, "19-1-duo-0")
    assert follower.ended()
    assert sorted(follower.lines) == sorted([
        ("19-1-duo-0", "[main] training"), ("19-1-duo-0", "[sidecar] serving"),
        ("19-1-duo-0", "[main] exited with code 0"), ("19-1-duo-0", "[sidecar] exited with code 0")])


def test_logs_of_a_jobs_workload_attempt(start, fake):
    backend, statuses = start(cluster_document(workload="jobs"))
    backend.create_attempt(20, 1, job_doc(pod_set("worker", 2)))
    run_all(fake, 20)
    statuses.wait(20, "RUNNING")
    listed = sorted(p["metadata"]["name"] for p in pods(fake, 20))  # named by the Job controller
    assert [pod for pod, _ in backend.logs(20, 1, pod_set="worker")] == listed
    assert list(backend.logs(20, 1, pod=listed[1])) == [(listed[1], "started")]


def test_api_errors_are_raised_with_the_api_servers_message(start, fake):
    backend, statuses = start(call_attempts=2)
    backend.create_attempt(21, 1, job_doc(pod_set("worker", 1)))
    run_all(fake, 21)
    fake.fail(503, path="/log$", times=1)
    assert list(backend.logs(21, 1)) == [("21-1-worker-0", "started")]  # a transient error is retried
    fake.fail(500, path="/log$", times=2)
    with pytest.raises(KubeError) as info:
        list(backend.logs(21, 1))
    assert str(info.value) == "500 InternalError: reading the log of pod 21-1-worker-0: injected fault 500"
    fake.fail(500, path="/log$", times=2)
    follower = Follower(backend.logs(21, 1, follow=True))
    assert follower.ended()
    assert isinstance(follower.error, KubeError) and "injected fault 500" in str(follower.error)
    fake.fail(403, path="/pods$", times=1, watch=False)
    with pytest.raises(KubeError, match="^403"):
        backend.logs(21, 1)


# -- the fake's log endpoint, through the official client ----------------------------------------------------

@pytest.fixture
def core(fake, tmp_path):
    api_client = config.new_client_from_config(config_file=str(tmp_path / "kubeconfig"), context="fake")
    yield client.CoreV1Api(api_client)
    api_client.close()


def raw_pod(name, *containers):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": c, "image": "busybox"} for c in containers or ("main",)]}}


def error(call, *args, **kwargs) -> tuple[int, str, str]:
    with pytest.raises(client.ApiException) as info:
        call(*args, **kwargs, _preload_content=False)
    body = json.loads(info.value.body)
    return info.value.status, body["reason"], body["message"]


def test_fake_log_endpoint_answers_like_the_api_server(core, fake):
    core.create_namespaced_pod(NS, raw_pod("solo"), _preload_content=False)
    core.create_namespaced_pod(NS, raw_pod("pair", "a", "b"), _preload_content=False)
    assert error(core.read_namespaced_pod_log, "ghost", NS) == (404, "NotFound", 'pods "ghost" not found')
    assert error(core.read_namespaced_pod_log, "solo", NS) == (
        400, "BadRequest", 'container "main" in pod "solo" is waiting to start: ContainerCreating')
    fake.run_pod(NS, "solo")
    fake.run_pod(NS, "pair")
    assert error(core.read_namespaced_pod_log, "pair", NS) == (
        400, "BadRequest", "a container name must be specified for pod pair, choose one of: [a b]")
    assert error(core.read_namespaced_pod_log, "pair", NS, container="c") == (
        400, "BadRequest", "container c is not valid for pod pair")
    fake.append_log(NS, "solo", "one\ntwo\nthree\n")
    fake.append_log(NS, "pair", "from b", container="b")
    assert core.read_namespaced_pod_log("solo", NS) == "started\none\ntwo\nthree\n"
    assert core.read_namespaced_pod_log("solo", NS, container="main", tail_lines=2) == "two\nthree\n"
    assert core.read_namespaced_pod_log("solo", NS, tail_lines=0) == ""
    assert core.read_namespaced_pod_log("solo", NS, limit_bytes=10) == "started\non"
    stamped = core.read_namespaced_pod_log("solo", NS, tail_lines=1, timestamps=True)
    assert stamped.endswith("Z three\n") and stamped[:4].isdigit()
    assert core.read_namespaced_pod_log("pair", NS, container="b") == "started\nfrom b\n"
    response = core.read_namespaced_pod_log("pair", NS, container="a", _preload_content=False)
    assert response.headers["Content-Type"] == "text/plain"
    assert error(core.read_namespaced_pod_log, "solo", NS, previous=True)[0] == 400
    assert error(core.read_namespaced_pod_log, "solo", NS, tail_lines=-1)[:2] == (422, "Invalid")


def test_fake_log_follow_streams_chunks_until_the_pod_ends_or_goes(core, fake):
    core.create_namespaced_pod(NS, raw_pod("solo"), _preload_content=False)
    fake.run_pod(NS, "solo")
    response = core.read_namespaced_pod_log("solo", NS, follow=True, _preload_content=False)
    assert response.headers["Transfer-Encoding"] == "chunked"
    chunks = response.stream(None)
    assert next(chunks) == b"started\n"
    fake.append_log(NS, "solo", "later")
    assert next(chunks) == b"later\n"
    fake.succeed_pod(NS, "solo")
    assert b"".join(chunks) == b"exited with code 0\n"  # and the stream ends
    core.create_namespaced_pod(NS, raw_pod("doomed"), _preload_content=False)
    fake.run_pod(NS, "doomed")
    response = core.read_namespaced_pod_log("doomed", NS, follow=True, tail_lines=0, _preload_content=False)
    fake.delete("pods", NS, "doomed")
    assert response.read() == b""  # deleted: the stream ends
    assert fake.log_lines(NS, "solo") == ["started", "later", "exited with code 0"]
