"""Edge links that come and go: a cut shorter than the cluster's lease requeues nothing and every
status arrives, in order, after reconnection; a cut longer than the lease reruns the job elsewhere and
the stale attempt is cancelled at the edge when it returns, with exactly one final result recorded."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from sqlalchemy import text

from devstack.embedded import Embedded, UpSettings
from dispatcher.store import clusters as cluster_store
from sluice.client import Client
from sluice.objects import load_objects
from tests.integration.test_spine import job_doc

LEASE_S = 8
CLASS_AND_QUEUE = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: default}
"""
OBJECTS = CLASS_AND_QUEUE + f"""---
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
    """system: an Embedded (its dispatcher) or a Dispatcher."""
    with getattr(system, "dispatcher", system).sessions.begin() as session:
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


FROZEN_OBJECTS = CLASS_AND_QUEUE + """---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: onprem}
spec: {tier: onprem, site: dc-1}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: edge}
spec: {tier: edge, site: edge-1, leaseDuration: 4s}
"""


def test_an_agent_frozen_past_its_lease_on_a_live_link_is_sent_the_cancel_and_stops_the_stale_attempt(db_url, tmp_path):
    """The edge agent is a real `sluice agent run` process, stopped (SIGSTOP) while its job runs, for longer than
    the lease: the job reruns at onprem. Resumed (SIGCONT), the agent's connection may still be the one it had:
    the cancel of attempt 1 reaches it all the same, and it deletes the attempt's pods."""
    from agent.backends.sim.cluster import SimCluster, SimConfig
    from agent.connection import Agent, AgentSettings
    from dispatcher.server import Dispatcher, ServerSettings
    from dispatcher.store import tokens
    from dispatcher.store.database import DatabaseSettings
    from sluice.config import ClientConfig
    from sluice.transport import PLAINTEXT
    from tests.integration.test_cli import REPO, base_env, free_port

    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None,
                                  database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(FROZEN_OBJECTS))
        admin = tokens.create(session, "admin", "admin")
        agent_tokens = {c: tokens.create(session, "agent", f"agent-{c}", c) for c in ("onprem", "edge")}
    set_state(d, "onprem", "cordoned")  # so that the job starts at the edge
    (tmp_path / "edge-token").write_text(agent_tokens["edge"])
    metrics_port = free_port()
    edge = subprocess.Popen([sys.executable, "-m", "sluice", "agent", "run", "--cluster", "edge", "--dispatcher",
                             d.address, "--token-file", str(tmp_path / "edge-token"), "--insecure", "--backend", "sim",
                             "--sim-nodes", "1", "--sim-node", "cpu=4,memory=8Gi",
                             "--metrics-listen", f"127.0.0.1:{metrics_port}"],
                            env=base_env(tmp_path), cwd=REPO, stderr=subprocess.DEVNULL)
    onprem = Agent(AgentSettings("onprem", d.address, agent_tokens["onprem"], tls=PLAINTEXT),
                   SimCluster(SimConfig(nodes=1, node={"cpu": 4000, "memory": 8 << 30}))).start()
    c = Client(ClientConfig(d.address, admin, timeout_s=10, insecure=True))

    def deleted_at_the_edge() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith('sluice_agent_attempts_deleted_total{cluster="edge"}'):
                    return float(line.split()[-1])
        return 0.0

    def cancel_acked(job_id: int) -> bool:
        with d.sessions() as session:
            return session.execute(text(
                "SELECT acked_at IS NOT NULL FROM outbox WHERE cluster = 'edge' AND kind = 'cancel' "
                "AND job_id = :j AND attempt = 1"), {"j": job_id}).scalar() or False
    try:
        [job_id] = c.submit([job_doc(cpu="1", duration="300s")])
        wait_for(lambda: (j := c.get(job_id))["state"] == "RUNNING" and j["cluster"] == "edge", 30, "runs at the edge")
        edge.send_signal(signal.SIGSTOP)
        set_state(d, "onprem", "active")
        wait_for(lambda: (j := c.get(job_id))["attempt"] == 2 and j["cluster"] == "onprem", 30, "rerun at onprem")
        assert not cancel_acked(job_id)  # the edge, stopped, has taken nothing
        edge.send_signal(signal.SIGCONT)
        wait_for(lambda: cancel_acked(job_id), 30, "the edge takes the cancel of attempt 1")
        wait_for(lambda: deleted_at_the_edge() == 1.0, 10, "the edge deletes the stale attempt's pods")
        job = c.get(job_id)
        assert job["attempt"] == 2 and job["cluster"] == "onprem" and job["state"] == "RUNNING", job
    finally:
        edge.send_signal(signal.SIGCONT)
        edge.send_signal(signal.SIGINT)
        edge.wait(15)
        c.close()
        onprem.stop()
        d.stop()
