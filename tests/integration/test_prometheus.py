"""Capacity from a real Prometheus server (Debian's `prometheus`, started on a free loopback port)
scraping the sim clusters' kube-state-metrics series every second."""
from __future__ import annotations

import shutil
import threading
import time

import pytest

from devstack.embedded import Embedded, UpSettings
from dispatcher.capacity.usable import DEFAULT_STALENESS_S
from sluice.client import Client
from sluice.objects import load_objects
from sluice.quantity import format_resources
from tests.integration.test_spine import job_doc, wait_final

needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary")

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: default}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: alpha}
spec: {tier: onprem, simulated: {nodes: 2, node: {cpu: "8", memory: 32Gi}}}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: beta}
spec: {tier: cloud, simulated: {nodes: 2, node: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "2"}}}
"""


@pytest.fixture
def system(db_url, tmp_path):
    embedded = Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                                   database_url=db_url, sim_time_scale=0.05, prometheus=True),
                        load_objects(OBJECTS)).start()
    embedded.wait_connected()
    embedded.client = Client(embedded.client_settings(timeout_s=10))
    yield embedded
    embedded.client.close()
    embedded.stop()


def views(client) -> dict[str, dict]:
    return {c["name"]: c for c in client.clusters()}


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def sim_view(sim) -> dict:
    capacity = sim.capacity()
    return {"allocatable": format_resources(capacity.allocatable), "free": format_resources(capacity.free),
            "largestFreeNode": format_resources(capacity.largest_free_node)}


@needs_prometheus
def test_capacity_comes_from_prometheus_and_falls_back_to_the_agent(system):
    shown = wait_for(lambda: (v := views(system.client))
                     and all(c["capacitySource"] == "prometheus" for c in v.values()) and v,
                     30, "both clusters read from prometheus")
    for name, sim in system.sims.items():
        view = shown[name]
        assert {k: view[k] for k in ("allocatable", "free", "largestFreeNode")} == sim_view(sim), name
        assert 0 <= view["capacityAgeSeconds"] <= DEFAULT_STALENESS_S
    # Prometheus goes away: within the staleness bound every cluster shows its agent's report instead.
    system.prometheus.stop()
    stopped = time.monotonic()
    wait_for(lambda: all(c["capacitySource"] == "agent" for c in views(system.client).values()),
             DEFAULT_STALENESS_S + 5, "fallback to the agents' reports")
    took = time.monotonic() - stopped
    assert took <= DEFAULT_STALENESS_S + 3, took
    # Still scheduling, on the agents' numbers.
    [job_id] = system.client.submit([job_doc(cpu="1", duration="1s")])
    assert wait_final(system.client, [job_id])[0]["state"] == "SUCCEEDED"


@needs_prometheus
def test_a_thousand_jobs_never_overcommit_and_leave_nothing_counted_twice(system):
    wait_for(lambda: all(c["capacitySource"] == "prometheus" for c in views(system.client).values()), 30,
             "both clusters read from prometheus")
    lowest: dict[str, dict[str, int]] = {name: {} for name in system.sims}
    stop = threading.Event()

    def watch():  # the sims' own books: requests of non-terminated pods never above what they hold
        while not stop.is_set():
            for name, sim in system.sims.items():
                for resource, amount in sim.capacity().free.items():
                    lowest[name][resource] = min(lowest[name].get(resource, amount), amount)
            time.sleep(0.005)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    docs = [job_doc(name=f"j{n}", cpu=str(1 + n % 3), duration=f"{1 + n % 4}s") for n in range(1000)]
    ids = system.client.submit(docs)
    try:
        jobs = wait_final(system.client, ids, timeout=240)
    finally:
        stop.set()
        watcher.join(5)
    assert all(j["state"] == "SUCCEEDED" for j in jobs)
    for name, sim in system.sims.items():
        assert sim.max_overcommit == {}, name
        assert all(v >= 0 for v in lowest[name].values()), (name, lowest[name])
        assert sim.duplicates == 0
    # Quiet again: what the dispatcher counts free is exactly what the clusters have free.
    def settled():
        shown = views(system.client)
        return all(c["capacitySource"] == "prometheus" and c["free"] == c["allocatable"] for c in shown.values())
    wait_for(settled, 15, "every cluster shows all of its capacity free once the run is over")


def test_up_says_clearly_when_prometheus_is_missing(tmp_path):
    import os
    import subprocess
    import sys
    data = tmp_path / "d"
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    result = subprocess.run([sys.executable, "-m", "sluice", "up", "--prometheus", "--data-dir", str(data),
                             "--listen", "127.0.0.1:0"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: up: the `prometheus` binary is not installed (Debian: apt-get install prometheus)")
    assert not (data / "postgres" / "postmaster.pid").exists()  # what it started, it stopped


@needs_prometheus
def test_up_with_an_elastic_cluster_at_zero_nodes_reads_zero_capacity(db_url, tmp_path):
    """No allocatable series yet (no nodes) is zero capacity, not an error: `sluice up --prometheus` starts."""
    from dispatcher.capacity.prometheus import PrometheusSettings, read
    objects = OBJECTS + """---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: burst}
spec:
  tier: cloud
  simulated: {nodes: 0, node: {cpu: "4", memory: 16Gi}}
  elastic: {maxNodes: 4, provisioningDelay: 5s}
"""
    embedded = Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                                   database_url=db_url, sim_time_scale=0.05, prometheus=True),
                        load_objects(objects)).start()
    try:
        embedded.wait_connected()
        with Client(embedded.client_settings(timeout_s=10)) as client:
            burst = wait_for(lambda: (v := views(client)["burst"])["capacitySource"] == "prometheus" and v,
                             30, "the elastic cluster read from prometheus")
            assert burst["allocatable"] == {} and burst["free"] == {}
        reading = read(PrometheusSettings(embedded.prometheus.url, '{cluster="burst"}'))
        assert reading.allocatable == {} and reading.free == {} and reading.attempts == frozenset()
    finally:
        embedded.stop()
