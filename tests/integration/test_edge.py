"""Edge links that come and go: a cut shorter than the cluster's lease requeues nothing and every
status arrives, in order, after reconnection; a cut longer than the lease reruns the job elsewhere and
the stale attempt is cancelled at the edge when it returns, with exactly one final result recorded."""
from __future__ import annotations

import time

import pytest

from devstack.embedded import Embedded, UpSettings
from dispatcher.store import clusters as cluster_store
from sluice.client import Client
from sluice.objects import load_objects
from tests.integration.test_spine import job_doc

LEASE_S = 8
OBJECTS = f"""
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {{name: standard}}
spec: {{priority: 500}}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {{name: default}}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {{name: onprem}}
spec: {{tier: onprem, site: dc-1, simulated: {{nodes: 1, node: {{cpu: "4", memory: 8Gi}}}}}}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {{name: edge}}
spec: {{tier: edge, site: edge-1, leaseDuration: {LEASE_S}s, simulated: {{nodes: 1, node: {{cpu: "4", memory: 8Gi}}}}}}
"""


@pytest.fixture
def system(db_url, tmp_path):
    embedded = Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                                   database_url=db_url, sim_time_scale=0.5), load_objects(OBJECTS)).start()
    embedded.wait_connected()
    embedded.client = Client(embedded.client_settings(timeout_s=10))
    yield embedded
    embedded.client.close()
    embedded.stop()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def set_state(system, cluster: str, state: str) -> None:
    with system.dispatcher.sessions.begin() as session:
        cluster_store.set_state(session, cluster, state)


def test_a_cut_shorter_than_the_lease_requeues_nothing_and_delivers_every_status_in_order(system):
    c = system.client
    [job_id] = c.submit([job_doc(cpu="1", duration="12s", placement={"sites": ["edge-1"]})])  # 6 s here
    wait_for(lambda: c.get(job_id)["state"] == "RUNNING", 10, "the job runs at the edge")
    edge = system.agents["edge"]
    edge.pause()  # longer than a heartbeat (and than `unreachable`), shorter than the lease
    wait_for(lambda: {x["name"]: x for x in c.clusters()}["edge"]["state"] == "unreachable", 10,
             "the edge shows unreachable")
    wait_for(lambda: all(s.state == "SUCCEEDED" for s in system.sims["edge"].inventory()), 10,
             "the job ends at the edge while its link is down")
    job = c.get(job_id)
    assert job["state"] == "RUNNING" and job["attempt"] == 1, job  # not requeued: the lease holds
    edge.resume()
    job = wait_for(lambda: (j := c.get(job_id))["state"] == "SUCCEEDED" and j, 15, "the result arrives")
    assert job["attempt"] == 1 and job["cluster"] == "edge"
    events = [(e["from"], e["to"]) for e in c.describe(job_id)["events"]]
    assert events == [(None, "QUEUED"), ("QUEUED", "DISPATCHED"), ("DISPATCHED", "RUNNING"), ("RUNNING", "SUCCEEDED")]


def test_a_cut_longer_than_the_lease_reruns_elsewhere_and_cancels_the_stale_attempt(system):
    c = system.client
    set_state(system, "onprem", "cordoned")  # so that the job starts at the edge
    [job_id] = c.submit([job_doc(cpu="1", duration="16s")])  # 8 s here; not pinned
    wait_for(lambda: (j := c.get(job_id))["state"] == "RUNNING" and j["cluster"] == "edge", 10, "runs at the edge")
    edge = system.agents["edge"]
    edge.pause()
    set_state(system, "onprem", "active")
    cut = time.monotonic()
    requeued = wait_for(lambda: (j := c.get(job_id))["attempt"] == 2 and j, LEASE_S + 10, "rerun after the lease")
    assert time.monotonic() - cut >= LEASE_S - 1  # not before the lease ran out
    reasons = [e["reason"] for e in c.describe(job_id)["events"]]
    assert any(f"longer than its lease ({LEASE_S}s)" in r for r in reasons), reasons
    assert requeued["cluster"] in (None, "onprem")
    edge.resume()  # the edge returns while its stale attempt 1 still runs there: it is cancelled
    wait_for(lambda: not [s for s in system.sims["edge"].inventory() if s.job_id == job_id and s.state == "RUNNING"],
             15, "the stale attempt is cancelled at the edge")
    job = wait_for(lambda: (j := c.get(job_id))["state"] == "SUCCEEDED" and j, 20, "attempt 2 finishes")
    assert job["attempt"] == 2 and job["cluster"] == "onprem"
    finals = [e for e in c.describe(job_id)["events"] if e["to"] in ("SUCCEEDED", "FAILED", "CANCELLED")]
    assert len(finals) == 1 and finals[0]["attempt"] == 2
