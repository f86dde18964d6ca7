"""`sluice logs`: a job's pod logs read by the agent of the cluster that ran it, over the agent's link, through a
real dispatcher and sim agents (the sim writes a line at each change of a pod)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from dispatcher.api import logs as relay
from sluice.client import ClientError
from tests.integration.test_cli import base_env
from tests.integration.test_spine import job_doc, wait_final


def lines_of(client, job_id: int, **options) -> list[dict]:
    return list(client.logs(job_id, **options))


def wait_state(client, job_id: int, state: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while (job := client.get(job_id))["state"] != state:
        assert time.monotonic() < deadline, f"job {job_id} never {state}: {job}"
        time.sleep(0.05)
    return job


def test_a_running_job_then_the_same_job_finished(system):
    c = system.client
    [job_id] = c.submit([job_doc(duration="3s", count=2)])
    job = wait_state(c, job_id, "RUNNING")
    running = lines_of(c, job_id)
    pods = sorted({line["pod"] for line in running})
    assert pods == [f"{job_id}-1-w-0", f"{job_id}-1-w-1"]
    assert {(line["attempt"], line["cluster"]) for line in running} == {(1, job["cluster"])}
    for pod in pods:
        mine = [line["line"] for line in running if line["pod"] == pod]
        assert mine[0].endswith("created; waiting for a node") and "started on node-" in mine[1], mine
    # Followed, the lines go on until both pods have ended.
    followed = lines_of(c, job_id, follow=True, pod_set="w")
    assert [line["line"] for line in followed if line["pod"] == pods[0]][-1].endswith("exited with code 0")
    wait_final(c, [job_id])
    finished = lines_of(c, job_id)  # the cluster still keeps the finished pods
    assert [line["line"] for line in finished if line["pod"] == pods[1]][-1].endswith(" exited with code 0")
    assert [line["line"] for line in lines_of(c, job_id, tail=1)] == [
        line["line"] for line in finished if line["line"].endswith("exited with code 0")]
    only = lines_of(c, job_id, pod=pods[1])
    assert {line["pod"] for line in only} == {pods[1]} and len(only) == 3


def test_what_has_no_logs_says_why(system):
    c = system.client
    [done] = c.submit([job_doc(duration="0.2s")])
    wait_final(c, [done])
    with pytest.raises(ClientError) as err:
        lines_of(c, done, pod="no-such-pod")
    assert err.value.code == "NOT_FOUND" and f"its pods: {done}-1-w-0" in str(err.value)
    with pytest.raises(ClientError) as err:
        lines_of(c, done, attempt=2)
    assert err.value.code == "NOT_FOUND" and "has no attempt 2" in str(err.value)
    # Cancelled while it ran: its pods are deleted, and so are their logs.
    [cancelled] = c.submit([job_doc(duration="600s")])
    wait_state(c, cancelled, "RUNNING")
    c.cancel([cancelled])
    wait_final(c, [cancelled])
    deadline = time.monotonic() + 10
    while True:  # the cancel reaches the agent a moment after the job is CANCELLED
        try:
            lines_of(c, cancelled)
        except ClientError as exc:
            assert exc.code == "NOT_FOUND" and "holds no pods" in str(exc), exc
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # Never dispatched: nothing has run yet.
    filler, waiting = c.submit([job_doc(cpu="8", count=2, duration="600s", placement={"sites": ["edge-1"]}),
                                job_doc(cpu="8", placement={"sites": ["edge-1"]})])  # the edge is full
    wait_state(c, filler, "RUNNING")
    with pytest.raises(ClientError) as err:
        lines_of(c, waiting)
    assert err.value.code == "NOT_FOUND" and "has not been dispatched yet" in str(err.value), err.value
    c.cancel([filler, waiting])
    with pytest.raises(ClientError) as err:
        lines_of(c, 10**9)
    assert err.value.code == "NOT_FOUND"


def test_an_unreachable_agent_is_a_clear_error_within_seconds(system, monkeypatch):
    c = system.client
    [job_id] = c.submit([job_doc(duration="600s")])
    cluster = wait_state(c, job_id, "RUNNING")["cluster"]
    agent = system.agents[cluster]
    agent.pause()  # the link dropped: not connected
    deadline = time.monotonic() + 10
    while True:
        began = time.monotonic()
        try:
            lines_of(c, job_id)
        except ClientError as exc:
            assert exc.code == "UNAVAILABLE" and f"agent of cluster {cluster} is not connected" in str(exc), exc
            assert time.monotonic() - began < 3
            break
        assert time.monotonic() < deadline, "still read through a dropped link"
        time.sleep(0.1)
    agent.resume()
    assert agent.connected.wait(10)
    assert lines_of(c, job_id)
    # Connected but not answering (its backend hangs): the call ends within the relay's answer time.
    monkeypatch.setattr(relay, "ANSWER_S", 1.0)
    hang = system.sims[cluster].logs
    monkeypatch.setattr(system.sims[cluster], "logs", lambda *a, **k: (time.sleep(5), (yield from hang(*a, **k))))
    began = time.monotonic()
    with pytest.raises(ClientError) as err:
        lines_of(c, job_id)
    assert err.value.code == "UNAVAILABLE" and "did not answer within 1s" in str(err.value)
    assert time.monotonic() - began < 4
    c.cancel([job_id])


def test_the_cli_prints_each_line_with_its_pod(system, tmp_path):
    c = system.client
    [job_id] = c.submit([job_doc(duration="0.2s")])
    wait_final(c, [job_id])
    config = tmp_path / "client.yaml"
    config.write_text(f"address: {system.dispatcher.address}\ntoken: {system.admin_token}\nca: {system.tls.ca}\n")
    env = {**base_env(tmp_path), "SLUICE_CONFIG": str(config)}

    def sluice(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sluice", *args], env=env, capture_output=True, text=True,
                              timeout=60)

    shown = sluice("logs", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1].startswith(f"[{job_id}-1-w-0] ")
    assert shown.stdout.splitlines()[-1].endswith("exited with code 0")
    one = sluice("logs", str(job_id), "--pod", f"{job_id}-1-w-0", "--tail", "1")
    assert one.returncode == 0 and one.stdout.strip().endswith("exited with code 0") and "[" not in one.stdout
    missing = sluice("logs", str(job_id), "--pod", "nope")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "has no pod 'nope'" in missing.stderr, missing.stderr
    both = sluice("logs", str(job_id), "--pod", "a", "--pod-set", "b")
    assert both.returncode != 0 and "not both" in both.stderr
