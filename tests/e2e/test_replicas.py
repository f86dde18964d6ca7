"""Three `sluice dispatcher serve` replicas on one Postgres, the leader killed with SIGKILL in the middle
of a 5,000-job run (docs/scaling.md):

- API calls work on every replica (jobs are submitted through all three, read through the survivors);
- exactly one replica leads (`sluice_scheduler_leader` on /metrics), and another leads within 5 s of
  the kill (measured from the kill to the new leader's log line, and checked on its /metrics);
- agents connected to replicas that never lead get the leader's commands (outbox + NOTIFY);
- every job ends once, with one successful attempt; no (job, attempt) is dispatched twice (one
  DISPATCHED event each) or created twice in any simulated cluster (in memory and in its ledger);
- the agent of the killed replica reconnects by itself to the next address of its list; the others
  stay connected.

The agents and simulated clusters run in this process; the replicas are real subprocesses.
"""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.sim.cluster import SimCluster, SimConfig
from agent.backends.sim.ledger import ledger_duplicates
from agent.connection import Agent, AgentSettings
from sluice.client import Client
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.transport import PLAINTEXT

N_JOBS = 5000
BEFORE_KILL = 4000  # submitted before the kill, through all three replicas; the rest through the survivors
KILL_AFTER_FINAL = 1000  # the leader is killed once this many jobs have ended
TAKEOVER_LIMIT_S = 5.0
RUN_LIMIT_S = 150.0
CLUSTERS = ("east", "west", "north")
CLASS_AND_QUEUE = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: default}
spec: {serviceClasses: [standard]}
"""
OBJECTS = CLASS_AND_QUEUE + "".join(f"""---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {{name: {name}}}
spec: {{tier: onprem, site: dc-{i}}}
""" for i, name in enumerate(CLUSTERS))
NODE = {"cpu": 32_000}  # milli-units: 32 cores per node, 8 nodes per cluster
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
READY = re.compile(r"serving on 127\.0\.0\.1:(\d+), metrics on 127\.0\.0\.1:(\d+)")
LEADER_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO dispatcher\.scheduler\.loop: became the scheduling leader",
    re.MULTILINE)


@dataclass
class Replica:
    proc: subprocess.Popen
    log: pathlib.Path
    address: str = ""
    metrics_port: int = 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def leader_since(self) -> list[float]:
        """Wall-clock times at which this replica logged that it became the leader."""
        return [datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp() for t in LEADER_LINE.findall(self.log_text())]

    def gauge(self, name: str) -> float | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and not s.labels:
                    return s.value
        return None


def start_replica(db_url: str, log: pathlib.Path, listen: str = "127.0.0.1:0") -> Replica:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url", db_url, "--listen", listen,
         "--metrics-listen", "127.0.0.1:0", "--insecure", "-v"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "ab"), start_new_session=True)
    return Replica(proc, log)


def wait_ready(replica: Replica, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not (found := READY.search(replica.log_text())):
        assert replica.proc.poll() is None, replica.log_text()[-3000:]
        assert time.monotonic() < deadline, f"replica not ready: {replica.log_text()[-3000:]}"
        time.sleep(0.05)
    replica.address, replica.metrics_port = f"127.0.0.1:{found.group(1)}", int(found.group(2))


def stop_replicas(replicas: list[Replica]) -> None:
    """SIGTERM to all at once, then SIGKILL to any still running after 15 s."""
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for r in replicas:
        try:
            r.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait(5)


def job(n: int) -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": f"replicas-{n}"},
            "spec": {"queue": "default", "podSets": [{"name": "w", "count": 1 + n % 2, "template": {
                "metadata": {"annotations": {"sluice.io/sim-duration": f"{0.2 + (n % 4) / 10:.1f}s"}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}]}}


def libpq(db_url: str) -> str:
    return db_url.replace("postgresql+psycopg://", "postgresql://", 1)


def counts(conn: psycopg.Connection) -> tuple[int, int]:
    """(jobs, final jobs)."""
    return conn.execute("SELECT count(*), count(*) FILTER (WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')) "
                        "FROM jobs").fetchone()


def seed(db_url: str, objects: str, clusters) -> tuple[str, dict[str, str]]:
    """Apply the objects (YAML) to the database; an admin token and each cluster's agent token."""
    from sqlalchemy.orm import Session

    from dispatcher.store import clusters as cluster_store
    from dispatcher.store import database, tokens

    db = database.connect(database.DatabaseSettings(url=db_url))
    try:
        with Session(db.engine) as session, session.begin():
            cluster_store.apply_objects(session, load_objects(objects))
            admin = tokens.create(session, "admin", "admin")
            return admin, {c: tokens.create(session, "agent", f"agent-{c}", c) for c in clusters}
    finally:
        db.close()


def assert_every_job_once(conn: psycopg.Connection, n_jobs: int) -> None:
    """Every job ended once, with one successful attempt, and none was dispatched twice (one DISPATCHED event
    per (job, attempt))."""
    assert counts(conn) == (n_jobs, n_jobs)
    assert conn.execute("SELECT count(*) FROM jobs WHERE state <> 'SUCCEEDED' OR attempt <> 1").fetchone()[0] == 0
    assert conn.execute("SELECT count(*), count(*) FILTER (WHERE state = 'SUCCEEDED') "
                        "FROM attempts").fetchone() == (n_jobs, n_jobs)
    ended = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM job_events "
                         "WHERE to_state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')").fetchone()
    assert ended == (n_jobs, n_jobs)
    dispatched = conn.execute("SELECT count(*), count(DISTINCT (job_id, attempt)) FROM job_events "
                              "WHERE to_state = 'DISPATCHED'").fetchone()
    assert dispatched == (n_jobs, n_jobs)


def reconnects(agent: Agent) -> float:
    return agent.metrics.registry.get_sample_value("sluice_agent_reconnects_total",
                                                   {"cluster": agent.settings.cluster})


def leaders(replicas: list[Replica]) -> list[Replica]:
    return [r for r in replicas if r.proc.poll() is None and r.gauge("sluice_scheduler_leader") == 1]


class LeaderWatch:
    """Scrapes every live replica's leader gauge five times a second: the most replicas seen leading at once.
    (Twice a second saw only 10 scrapes in a run once: the 5,000 jobs had gone through in about 5 s.)"""

    def __init__(self, replicas: list[Replica]):
        self.replicas, self.most, self.scrapes = replicas, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.most = max(self.most, len(leaders(self.replicas)))
                self.scrapes += 1
            except OSError:
                pass  # a replica killed between the poll() and the scrape

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.slow
def test_three_replicas_survive_the_leader_being_killed(db_url, tmp_path):
    admin, agent_tokens = seed(db_url, OBJECTS, CLUSTERS)

    begun = time.monotonic()
    replicas: list[Replica] = []
    agents: list[Agent] = []
    sims: dict[str, SimCluster] = {}
    clients: list[Client] = []
    watch: LeaderWatch | None = None
    try:
        for i in range(3):
            replicas.append(start_replica(db_url, tmp_path / f"replica-{i}.log"))
        for r in replicas:
            wait_ready(r)
        deadline = time.monotonic() + 10
        while len(found := leaders(replicas)) != 1:
            assert time.monotonic() < deadline, "no single leader among the replicas"
            time.sleep(0.1)
        [leader] = found
        watch = LeaderWatch(replicas)
        # Agent i dials replica i first, then the others in turn: one agent sits on the leader, two on
        # replicas that never decide anything and only relay the leader's commands.
        addresses = [r.address for r in replicas]
        for i, cluster in enumerate(CLUSTERS):
            sims[cluster] = SimCluster(SimConfig(nodes=8, node=NODE, ledger_path=tmp_path / f"{cluster}.ledger"))
            listed = ",".join(addresses[i:] + addresses[:i])
            agents.append(Agent(AgentSettings(cluster, listed, agent_tokens[cluster], backoff_max_s=1.0, tls=PLAINTEXT),
                                sims[cluster]).start())
        for a in agents:
            assert a.connected.wait(15), f"agent {a.settings.cluster} did not connect"
        assert [a.address for a in agents] == addresses
        on_leader = agents[replicas.index(leader)]
        clients = [Client(ClientConfig(r.address, admin, timeout_s=60, insecure=True)) for r in replicas]

        with psycopg.connect(libpq(db_url), autocommit=True) as conn:
            started = time.monotonic()
            ready_s = started - begun
            ids: list[int] = []
            for b, first in enumerate(range(0, BEFORE_KILL, 500)):  # through every replica in turn
                ids += clients[b % 3].submit([job(n) for n in range(first, first + 500)])
            submitted_s = time.monotonic() - started
            while counts(conn)[1] < KILL_AFTER_FINAL:
                assert time.monotonic() - started < RUN_LIMIT_S, f"too slow before the kill: {counts(conn)}"
                time.sleep(0.05)

            # SIGKILL the leader; time until a survivor logs that it leads, and until its gauge says so.
            killed_with = counts(conn)[1]
            killed_at = time.time()
            os.killpg(leader.proc.pid, signal.SIGKILL)
            survivors = [r for r in replicas if r is not leader]
            deadline = time.monotonic() + TAKEOVER_LIMIT_S + 5
            while not (now_leading := leaders(survivors)):
                assert time.monotonic() < deadline, "no replica took over"
                time.sleep(0.05)
            gauge_s = time.time() - killed_at
            [new_leader] = now_leading
            takeover_s = new_leader.leader_since()[-1] - killed_at
            leader.proc.wait(5)
            assert takeover_s < TAKEOVER_LIMIT_S, f"took {takeover_s:.2f}s to take over"
            assert [r for r in survivors if r.leader_since()] == [new_leader]

            survivor_clients = [c for c, r in zip(clients, replicas) if r is not leader]
            for b, first in enumerate(range(BEFORE_KILL, N_JOBS, 500)):
                ids += survivor_clients[b % 2].submit([job(n) for n in range(first, first + 500)])
            assert len(set(ids)) == N_JOBS
            while counts(conn)[1] < N_JOBS:
                assert time.monotonic() - started < RUN_LIMIT_S, f"not every job ended in time: {counts(conn)}"
                time.sleep(0.1)
            run_s = time.monotonic() - started

            assert_every_job_once(conn, N_JOBS)
            commands = conn.execute("SELECT count(*), count(DISTINCT (job_id, attempt)), "
                                    "count(*) FILTER (WHERE kind <> 'dispatch') FROM outbox").fetchone()
            assert commands == (N_JOBS, N_JOBS, 0)
        # No (job, attempt) created twice in any cluster, and every pod created exactly once.
        assert [s.duplicates for s in sims.values()] == [0, 0, 0]
        assert [ledger_duplicates(tmp_path / f"{c}.ledger") for c in CLUSTERS] == [0, 0, 0]
        assert sum(s.pods_created for s in sims.values()) == sum(1 + n % 2 for n in range(N_JOBS))
        # Commands decided by the leader reached the agents on the other replicas too.
        assert all(s.pods_created > 0 for s in sims.values())
        # The API answers on every survivor, with the same data.
        for c in survivor_clients:
            assert c.get(ids[0])["state"] == "SUCCEEDED"
            assert len(c.list(state="SUCCEEDED", limit=3)) == 3 and c.list(state="QUEUED", limit=1) == []
        # The killed replica's agent moved on by itself; the others never dropped their link.
        assert all(a.connected.is_set() for a in agents)
        assert on_leader.address != leader.address and reconnects(on_leader) >= 1
        assert [reconnects(a) for a in agents if a is not on_leader] == [0, 0]
        watch.stop()
        assert watch.scrapes > 10 and watch.most == 1, "two replicas led at once"
        print(f"\n{N_JOBS} jobs through 3 replicas in {run_s:.1f}s ({N_JOBS / run_s:.0f} jobs/s end to end; "
              f"{BEFORE_KILL} submitted in {submitted_s:.2f}s); leader SIGKILLed with {killed_with} ended; "
              f"another led {takeover_s:.2f}s later (its gauge seen at {gauge_s:.2f}s); "
              f"replicas and agents ready in {ready_s:.1f}s")
    finally:
        if watch is not None:
            watch.stop()
        for c in clients:
            c.close()
        for a in agents:
            a.stop()
        stop_replicas(replicas)


def test_an_agent_skips_a_dead_address_in_its_list(db_url):
    import socket

    from dispatcher.server import Dispatcher, ServerSettings
    from dispatcher.store import clusters as cluster_store
    from dispatcher.store import tokens
    from dispatcher.store.database import DatabaseSettings

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, database=DatabaseSettings(url=db_url)))
    d.start()
    agent = None
    try:
        with d.sessions.begin() as session:
            cluster_store.apply_objects(session, load_objects(OBJECTS))
            token = tokens.create(session, "agent", "agent-east", "east")
        agent = Agent(AgentSettings("east", f"{dead},{d.address}", token, backoff_max_s=0.5, tls=PLAINTEXT),
                      SimCluster(SimConfig(nodes=1, node=NODE))).start()
        assert agent.connected.wait(10)
        assert agent.address == d.address and reconnects(agent) == 1
    finally:
        if agent is not None:
            agent.stop()
        d.stop()
