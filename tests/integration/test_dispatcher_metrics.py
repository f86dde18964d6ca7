"""The dispatcher's /metrics, scraped over HTTP from a real dispatcher with sim agents (docs/metrics.md)."""
from __future__ import annotations

import math
import socket
import ssl
import time
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from dispatcher.metrics import StoreCollector
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store.database import DatabaseSettings
from sluice.quantity import parse_quantity
from tests.integration.test_spine import job_doc, wait_final

DOCUMENTED = ("sluice_jobs_queued", "sluice_jobs_active", "sluice_queue_used", "sluice_outbox_unacked_commands",
              "sluice_outbox_oldest_unacked_age_seconds", "sluice_cluster_capacity",
              "sluice_cluster_capacity_age_seconds", "sluice_database_up", "sluice_dispatch_latency_seconds",
              "sluice_scheduling_cycle_seconds", "sluice_scheduling_cycles", "sluice_scheduling_decisions")


def scrape(port: int, ca: str | None = None) -> str:
    """/metrics over HTTPS verified against `ca` (a `sluice up` dispatcher's), or plain HTTP without one."""
    scheme, context = ("https", ssl.create_default_context(cafile=ca)) if ca else ("http", None)
    with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/metrics", timeout=10, context=context) as reply:
        assert reply.status == 200
        return reply.read().decode()


def samples(text: str, name: str) -> dict[tuple, float]:
    """{sorted label items: value} of every sample called `name`."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels) -> float:
    found = samples(text, name)
    key = tuple(sorted(labels.items()))
    assert key in found, f"{name}{labels} not in {sorted(found)}"
    return found[key]


def base(quantity: str) -> float:
    return parse_quantity(quantity) / 1000


def wait_for(check, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_metrics_port_is_bound_to_loopback_only(system):
    d = system.dispatcher
    assert d.metrics_port > 0 and d.metrics_server.host == "127.0.0.1"
    text = scrape(d.metrics_port, system.tls.ca)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert set(DOCUMENTED) <= names, set(DOCUMENTED) - names
    assert value(text, "sluice_database_up") == 1
    # From another address of this host, nothing answers.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing address
            other = probe.getsockname()[0]
    except OSError:
        other = ""
    if other and not other.startswith("127."):
        with pytest.raises(OSError):
            socket.create_connection((other, d.metrics_port), timeout=2).close()


def test_metrics_follow_jobs_queues_and_clusters(system):
    client, d = system.client, system.dispatcher
    short = client.submit([job_doc(name=f"short-{i}", cpu="1", duration="0.5s") for i in range(4)])
    long = client.submit([job_doc(name=f"long-{i}", cpu="2", duration="600s") for i in range(2)])
    # Two 8-cpu pods fill both edge nodes; the jobs pinned behind them wait, in two service classes.
    filler = client.submit([job_doc(name="filler", cpu="8", count=2, duration="600s", placement={"sites": ["edge-1"]})])
    wait_for(lambda: all(client.get(i)["state"] == "RUNNING" for i in long + filler), "long jobs running")
    waiting = client.submit([job_doc(name="w-std", cpu="1", placement={"sites": ["edge-1"]}),
                             job_doc(name="w-batch", cpu="1", serviceClass="batch", placement={"sites": ["edge-1"]})])
    wait_final(client, short)
    wait_for(lambda: all("no cluster fits" in client.get(i)["reason"] for i in waiting), "waiting reasons")

    text = scrape(d.metrics_port, system.tls.ca)
    jobs = client.list()
    queued = Counter((j["queue"], j["serviceClass"]) for j in jobs if j["state"] == "QUEUED")
    assert queued == Counter({("default", "standard"): 1, ("default", "batch"): 1})
    shown = {(dict(k)["queue"], dict(k)["service_class"]): v for k, v in samples(text, "sluice_jobs_queued").items()}
    assert {k: v for k, v in shown.items() if v} == queued
    assert shown[("default", "critical")] == 0  # every class the queue accepts has a series
    active = Counter((j["queue"], j["cluster"]) for j in jobs if j["state"] in ("DISPATCHED", "RUNNING"))
    assert active == Counter({("default", "onprem"): 2, ("default", "edge"): 1})
    shown = {(dict(k)["queue"], dict(k)["cluster"]): v for k, v in samples(text, "sluice_jobs_active").items()}
    assert {k: v for k, v in shown.items() if v} == active and shown[("default", "cloud")] == 0

    # Used resources: per queue and cluster, in base units; summed over clusters they are the queue's `used`.
    assert value(text, "sluice_queue_used", queue="default", cluster="edge", resource="cpu") == 16
    assert value(text, "sluice_queue_used", queue="default", cluster="onprem", resource="cpu") == 4
    [queue] = [q for q in client.queues() if q["name"] == "default"]
    used: dict[str, float] = {}
    for k, v in samples(text, "sluice_queue_used").items():
        labels = dict(k)
        if labels["queue"] == "default":
            used[labels["resource"]] = used.get(labels["resource"], 0) + v
    assert used == {r: base(q) for r, q in queue["used"].items()} and used["cpu"] == 20

    # Latency histograms and cycle counters saw the work.
    count = value(text, "sluice_dispatch_latency_seconds_count", phase="submit_to_dispatch")
    assert count >= 7 and value(text, "sluice_dispatch_latency_seconds_sum", phase="submit_to_dispatch") > 0
    assert value(text, "sluice_dispatch_latency_seconds_count", phase="dispatch_to_running") >= 7
    assert value(text, "sluice_dispatch_latency_seconds_bucket", phase="dispatch_to_running", le="+Inf") >= 7
    cycles = value(text, "sluice_scheduling_cycles_total")
    assert cycles >= 1 and value(text, "sluice_scheduling_cycle_seconds_count") == cycles
    assert value(text, "sluice_scheduling_decisions_total", decision="dispatched") >= 7
    assert value(text, "sluice_scheduling_decisions_total", decision="waiting") >= 2
    assert value(text, "sluice_scheduling_decisions_total", decision="preempted") == 0

    # Outbox gauges exist for every cluster; every agent is connected and acks what it gets.
    names = {c["name"] for c in client.clusters()}
    unacked = {dict(k)["cluster"]: v for k, v in samples(text, "sluice_outbox_unacked_commands").items()}
    oldest = {dict(k)["cluster"]: v for k, v in samples(text, "sluice_outbox_oldest_unacked_age_seconds").items()}
    assert set(unacked) == set(oldest) == names
    assert all(v >= 0 for v in [*unacked.values(), *oldest.values()])

    # Capacity: the same numbers, source and age as `sluice clusters` shows (read at another instant:
    # retried until a scrape and a listing fall between the same two heartbeats).
    def capacity_matches():
        text = scrape(d.metrics_port, system.tls.ca)
        shown = client.clusters()
        capacity = samples(text, "sluice_cluster_capacity")
        ages = samples(text, "sluice_cluster_capacity_age_seconds")
        for c in shown:
            for kind in ("allocatable", "free"):
                got = {dict(k)["resource"]: v for k, v in capacity.items()
                       if dict(k)["cluster"] == c["name"] and dict(k)["kind"] == kind}
                if got != {r: base(q) for r, q in c[kind].items()}:
                    return False
            [(labels, age)] = [(dict(k), v) for k, v in ages.items() if dict(k)["cluster"] == c["name"]]
            if labels["source"] != c["capacitySource"] or not 0 <= age < 10:
                return False
        return shown
    shown = wait_for(capacity_matches, "capacity gauges equal to `sluice clusters`")
    edge = next(c for c in shown if c["name"] == "edge")
    assert base(edge["free"]["cpu"]) == 0 and base(edge["allocatable"]["cpu"]) == 16

    # Each further cycle counts.
    more = client.submit([job_doc(name="more", cpu="1", duration="0.2s")])
    wait_final(client, more)
    again = scrape(d.metrics_port, system.tls.ca)
    assert value(again, "sluice_scheduling_cycles_total") > cycles
    assert value(again, "sluice_dispatch_latency_seconds_count", phase="submit_to_dispatch") > count


def test_outbox_gauges_show_a_command_its_agent_has_not_acked(system):
    client, d = system.client, system.dispatcher
    [job_id] = client.submit([job_doc(cpu="1", duration="600s", placement={"sites": ["edge-1"]})])
    wait_for(lambda: client.get(job_id)["state"] == "RUNNING", "job running on edge")
    wait_for(lambda: value(scrape(d.metrics_port, system.tls.ca), "sluice_outbox_unacked_commands",
                           cluster="edge") == 0, "the dispatch acked")
    system.agents["edge"].stop()  # the cancel below waits in the outbox
    client.cancel([job_id])
    time.sleep(0.3)
    text = scrape(d.metrics_port, system.tls.ca)
    assert value(text, "sluice_outbox_unacked_commands", cluster="edge") == 1
    assert value(text, "sluice_outbox_oldest_unacked_age_seconds", cluster="edge") >= 0.2
    assert value(text, "sluice_outbox_unacked_commands", cluster="onprem") == 0
    assert value(text, "sluice_outbox_oldest_unacked_age_seconds", cluster="onprem") == 0


def test_each_dispatcher_has_its_own_registry(system, db_url):
    """A second replica on the same database: the same database gauges, none of the leader's cycles."""
    client = system.client
    [job_id] = client.submit([job_doc(cpu="1", duration="600s")])
    wait_for(lambda: client.get(job_id)["state"] == "RUNNING", "job running")
    follower = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    try:
        assert follower.metrics_port not in (0, system.dispatcher.metrics_port)
        mine, leaders = scrape(follower.metrics_port), scrape(system.dispatcher.metrics_port, system.tls.ca)
        assert not follower.scheduler.is_leader.is_set()
        assert value(mine, "sluice_scheduling_cycles_total") == 0
        assert value(leaders, "sluice_scheduling_cycles_total") >= 1
        assert samples(mine, "sluice_jobs_active") == samples(leaders, "sluice_jobs_active")
    finally:
        follower.stop()


def test_metrics_can_be_turned_off(db_url):
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None,
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        assert d.metrics_port == 0 and d.metrics_server is None
    finally:
        d.stop()


def test_bad_metrics_address_is_refused(db_url):
    with pytest.raises(OSError, match="cannot serve metrics on"):
        Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen="9464",
                                  database=DatabaseSettings(url=db_url)))


def test_unreadable_database_is_reported_not_raised(tmp_path):
    engine = create_engine(f"postgresql+psycopg://postgres@/nothing?host={tmp_path}&connect_timeout=2")
    try:
        families = list(StoreCollector(sessionmaker(engine), unreachable_after_s=5.0).collect())
    finally:
        engine.dispose()
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [("sluice_database_up", [0.0])]
    assert not math.isnan(families[0].samples[0].value)
