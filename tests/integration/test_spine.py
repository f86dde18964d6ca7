"""The whole path, for real: submit -> Postgres -> scheduler -> gRPC -> sim agent -> status."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from sluice.client import ClientError
from tests.integration.scenarios import wait_final


def job_doc(name="j", cpu="1", duration="0.5s", exit_code="0", count=1, **spec):
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"queue": "default", **spec, "podSets": [{"name": "w", "count": count, "template": {
                "metadata": {"annotations": {"sluice.io/sim-duration": duration, "sluice.io/sim-exit-code": exit_code}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}}}]}}


def test_job_runs_to_success(system):
    [job_id] = system.client.submit([job_doc()])
    [job] = wait_final(system.client, [job_id])
    assert job["state"] == "SUCCEEDED" and job["cluster"] == "onprem" and job["attempt"] == 1
    assert job["startedAt"] and job["finishedAt"]
    events = [e["to"] for e in system.client.describe(job_id)["events"]]
    assert events == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]


def test_a_running_attempt_s_address_is_in_describe(system):
    session = job_doc(duration="60s")
    session["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 8888}]
    [job_id, plain] = system.client.submit([session, job_doc(duration="60s")])
    deadline = time.monotonic() + 15
    while {system.client.get(i)["state"] for i in (job_id, plain)} != {"RUNNING"}:
        assert time.monotonic() < deadline, system.client.get(job_id)
        time.sleep(0.05)
    described = system.client.describe(job_id)
    [attempt] = described["attempts"]
    assert attempt["attempt"] == 1 and attempt["state"] == "RUNNING" and attempt["cluster"] == described["cluster"]
    assert attempt["address"] == f"{job_id}-1-w-0.{described['cluster']}.sim:8888"
    assert attempt["startedAt"] and attempt["finishedAt"] is None
    assert system.client.describe(plain)["attempts"][0]["address"] == f"{plain}-1-w-0.{described['cluster']}.sim"
    env = {**os.environ, "SLUICE_CONFIG": str(system.client_config_path)}
    cli = [sys.executable, "-m", "sluice", "describe", str(job_id)]
    root = pathlib.Path(__file__).resolve().parents[2]
    table = subprocess.run(cli, env=env, cwd=root, capture_output=True, text=True, timeout=30, check=True).stdout
    assert f"address:      {attempt['address']}\n" in table
    shown = json.loads(subprocess.run([*cli, "-o", "json"], env=env, cwd=root, capture_output=True, text=True,
                                      timeout=30, check=True).stdout)
    assert shown["attempts"][0]["address"] == attempt["address"]
    system.client.cancel([job_id, plain])
    ended = system.client.describe(job_id)["attempts"][0]
    assert ended["state"] == "CANCELLED" and ended["address"] == attempt["address"]  # kept, but not shown any more
    table = subprocess.run(cli, env=env, cwd=root, capture_output=True, text=True, timeout=30, check=True).stdout
    assert "address:" not in table


def test_the_dispatcher_knows_on_which_named_nodes_a_running_attempt_holds_its_room(system, db_url):
    from datetime import UTC, datetime

    from sqlalchemy.orm import sessionmaker

    from dispatcher.capacity import snapshot
    from dispatcher.scheduler.mapping import active_from_rows
    from dispatcher.store import cycle_reads, database

    [job_id] = system.client.submit([job_doc(duration="60s", count=3)])
    deadline = time.monotonic() + 15
    while system.client.get(job_id)["state"] != "RUNNING":
        assert time.monotonic() < deadline, system.client.get(job_id)
        time.sleep(0.05)
    db = database.connect(database.DatabaseSettings(url=db_url))
    try:
        with sessionmaker(db.engine)() as session:
            [active] = [a for a in active_from_rows(cycle_reads.active_attempts(session, nodes=True), {})
                        if a.job_id == job_id]
            read = snapshot.read(session, datetime.now(UTC), unreachable_after_s=60)
            clusters = {c.state.name: c.state for c in read}
    finally:
        db.close()
    cluster = clusters[active.cluster]
    assert sum(held["cpu"] for _, held in active.nodes) == 3000  # its three 1-cpu pods, node by node
    assert {node for node, _ in active.nodes} <= set(cluster.node_names)
    assert len(cluster.node_names) == len(cluster.node_free) > 0
    system.client.cancel([job_id])


def test_failed_job_retries_then_fails(system):
    [job_id] = system.client.submit([job_doc(exit_code="3", maxRetries=1)])
    [job] = wait_final(system.client, [job_id])
    assert job["state"] == "FAILED" and job["attempt"] == 2
    assert "exited with code 3" in job["reason"]


def test_overflow_bursts_to_cloud_and_edge_pins_stay_on_edge(system):
    # onprem holds 128 cpu and the edge 16: 24 jobs of 8 cpu need 192. Each may run an hour
    # (maxRuntime), so no on-prem start is expected within the standard class's 10 minutes: the rest
    # bursts to the cloud at once, under the default cloud-burst policy.
    ids = system.client.submit([job_doc(cpu="8", duration="2s", maxRuntime="1h") for _ in range(24)])
    pinned = system.client.submit([job_doc(cpu="1", placement={"sites": ["edge-1"]}) for _ in range(3)])
    jobs = wait_final(system.client, ids + pinned)
    assert all(j["state"] == "SUCCEEDED" for j in jobs)
    clusters = [j["cluster"] for j in jobs[:24]]
    assert clusters.count("cloud") >= 24 - 16 - 2 and set(clusters) <= {"onprem", "edge", "cloud"}
    assert {j["cluster"] for j in jobs[24:]} == {"edge"}


def test_cancel_running_job_stops_its_pods(system):
    [job_id] = system.client.submit([job_doc(duration="60s")])
    deadline = time.monotonic() + 10
    while system.client.get(job_id)["state"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    [cancelled] = system.client.cancel([job_id])
    assert cancelled["state"] == "CANCELLED"
    sim = system.sims["onprem"]
    deadline = time.monotonic() + 10
    while sim.capacity().free != sim.capacity().allocatable:
        assert time.monotonic() < deadline, "cancelled pods still hold capacity"
        time.sleep(0.05)


def test_waiting_job_says_why(system):
    [job_id] = system.client.submit([job_doc(cpu="1", placement={"sites": ["edge-1"]}, duration="30s", count=8)])
    [blocked] = system.client.submit([job_doc(cpu="4", placement={"sites": ["edge-1"]}, count=4)])
    deadline = time.monotonic() + 10
    while "no cluster fits" not in (job := system.client.get(blocked))["reason"]:
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["state"] == "QUEUED"
    assert "edge: needs 16 cpu, 8 free" in job["reason"]
    assert system.client.describe(blocked)["queuePosition"] == 1
    system.client.cancel([job_id, blocked])


def test_impossible_and_invalid_jobs_are_refused_and_change_nothing(system):
    before = system.client.list(limit=0)
    with pytest.raises(ClientError) as err:
        system.client.submit([job_doc(), job_doc(cpu="1000")])
    assert err.value.code == "INVALID_ARGUMENT" and "document 2: no cluster could ever run it" in err.value.message
    with pytest.raises(ClientError) as err:
        system.client.submit([job_doc(queue="nope")])
    assert err.value.code == "NOT_FOUND" and "queue 'nope' not found" in err.value.message
    bad = job_doc()
    bad["spec"]["podSets"][0]["count"] = 0
    with pytest.raises(ClientError) as err:
        system.client.submit([bad])
    assert err.value.code == "INVALID_ARGUMENT" and "spec.podSets[0].count" in err.value.message
    assert system.client.list(limit=0) == before


def test_watch_resumes_from_a_cursor(system):
    [job_id] = system.client.submit([job_doc(duration="0.1s")])
    wait_final(system.client, [job_id])
    events = []
    for event in system.client.watch(job_id):
        events.append(event)
        if event["to"] == "SUCCEEDED":
            break
    assert [e["to"] for e in events] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    resumed = next(iter(system.client.watch(job_id, after_event_id=events[1]["id"])))
    assert resumed["id"] == events[2]["id"]


def test_list_pages_and_filters(system):
    ids = system.client.submit([job_doc(duration="0.1s") for _ in range(5)])
    wait_final(system.client, ids)
    assert [j["id"] for j in system.client.list(limit=0)] == ids
    assert [j["id"] for j in system.client.list(limit=3)] == ids[:3]
    assert system.client.list(state="QUEUED") == []
    with pytest.raises(ClientError) as err:
        system.client.list(state="BOGUS")
    assert err.value.code == "INVALID_ARGUMENT"


def test_clusters_and_queues_views(system):
    clusters = {c["name"]: c for c in system.client.clusters()}
    assert set(clusters) == {"onprem", "cloud", "edge"}
    assert clusters["onprem"]["capacitySource"] == "agent" and clusters["onprem"]["state"] == "active"
    assert clusters["onprem"]["allocatable"]["cpu"] == "128"
    queues = {q["name"]: q for q in system.client.queues()}
    assert queues["default"]["queuedJobs"] == 0


def test_calls_without_a_valid_token_are_refused(system):
    from sluice.client import Client
    with Client(system.client_settings("sl_wrong")) as bad:
        with pytest.raises(ClientError) as err:
            bad.list()
    assert err.value.code == "UNAUTHENTICATED"


def test_explain_gives_a_verdict_per_cluster(system):
    [job_id] = system.client.submit([job_doc(cpu="1", placement={"sites": ["edge-1"]}, duration="30s", count=8)])
    [blocked] = system.client.submit([job_doc(cpu="4", placement={"sites": ["edge-1"]}, count=4)])
    deadline = time.monotonic() + 10
    while system.client.get(job_id)["state"] not in ("DISPATCHED", "RUNNING"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    info = system.client.explain(blocked)
    verdicts = {c["cluster"]: c["verdict"] for c in info["clusters"]}
    assert [c["cluster"] for c in info["clusters"]] == ["onprem", "cloud", "edge"]
    assert verdicts["onprem"].startswith("not allowed by its placement (sites edge-1): tier onprem")
    assert verdicts["edge"] == "needs 16 cpu, 8 free"
    assert info["quota"] == "within the quotas of queue default and its parents"
    assert info["queuePosition"] == 1
    running = {c["cluster"]: c["verdict"] for c in system.client.explain(job_id)["clusters"]}
    assert running["edge"].startswith("runs here")
    with pytest.raises(ClientError) as err:
        system.client.explain(999999)
    assert err.value.code == "NOT_FOUND"
    system.client.cancel([job_id, blocked])
