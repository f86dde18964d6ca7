"""The series the dashboard and the alert rules read (deploy/monitoring), scraped from a real dispatcher:
a queue tree's use rolled up to its parents, guarantees and maxima, the oldest queued job, what each queue
had dispatched, whether each cluster is heard from, burst spend against budgets, and submits by outcome."""
from __future__ import annotations

import pytest

from sluice.client import ClientError
from tests.integration.scenarios import cluster, job, queue, wait_for
from tests.integration.test_burst import CLASSES, policy
from tests.integration.test_dispatcher_metrics import samples, scrape, value

OBJECTS = (CLASSES.replace("after: 3s", "after: 0s")
           + queue("org", guaranteed={"cpu": "6"}, max={"cpu": "8"})
           + queue("team-a", parent="org", guaranteed={"cpu": "2"}) + queue("team-b", parent="org")
           + queue("idle", guaranteed={"cpu": "1"})
           + cluster("onprem", 4) + cluster("cloud", 8, tier="cloud", site="cloud-1", price={"cpu": 0.05})
           + policy(after="0s", budget={"perDay": 1.0}, perQueue={"budget": {"perHour": 0.5}}))


def test_a_parent_queue_shows_what_its_children_use(sluice):
    s = sluice(OBJECTS)
    c, port, ca = s.client, s.dispatcher.metrics_port, s.tls.ca
    a = c.submit([job("team-a", "1", "600s", name="a") for _ in range(3)])
    b = c.submit([job("team-b", "2", "600s", name="b", maxRuntime="1h")])
    wait_for(lambda: all(c.get(i)["state"] == "RUNNING" for i in a + b), 20, "the jobs running")
    # org's max of 8 cpu, with 5 in use: a 4-cpu job of team-b waits on the parent's maximum.
    [waiting] = c.submit([job("team-b", "4", "1s", name="waits")])
    wait_for(lambda: "org" in c.get(waiting)["reason"], 10, "the waiting job's reason")

    views = {q["name"]: q for q in c.queues()}
    assert views["org"]["used"]["cpu"] == "5" and views["team-a"]["used"]["cpu"] == "3"
    assert views["team-b"]["used"]["cpu"] == "2"
    assert (views["org"]["runningJobs"], views["org"]["queuedJobs"]) == (4, 1)
    assert (views["team-b"]["runningJobs"], views["team-b"]["queuedJobs"]) == (1, 1)
    # Fair shares over 12 cpu in all (onprem 4, cloud 8): team-a 3/12, team-b 2/12 (weight 1 each); idle 0.
    assert views["team-a"]["fairShare"] == pytest.approx(0.25)
    assert views["team-b"]["fairShare"] == pytest.approx(2 / 12, abs=1e-6)
    assert (views["team-b"]["fairShareRank"], views["team-a"]["fairShareRank"]) == (1, 2)
    assert (views["idle"]["fairShareRank"], views["org"]["fairShareRank"]) == (1, 2)

    text = scrape(port, ca)
    used = {(d["queue"], d["cluster"]): v for k, v in samples(text, "sluice_queue_used").items()
            if (d := dict(k))["resource"] == "cpu"}
    assert sum(v for (q, _), v in used.items() if q == "org") == 5
    assert sum(v for (q, _), v in used.items() if q == "team-a") == 3
    assert not any(q == "idle" for q, _ in used)
    assert value(text, "sluice_queue_guaranteed", queue="org", resource="cpu") == 6
    assert value(text, "sluice_queue_max", queue="org", resource="cpu") == 8
    assert ("queue", "team-b") not in {kv for k in samples(text, "sluice_queue_guaranteed") for kv in k}

    # The oldest queued job's age: team-b's waiting one; 0 for a queue with nothing queued.
    assert 0 < value(text, "sluice_queue_oldest_queued_age_seconds", queue="team-b") < 60
    assert value(text, "sluice_queue_oldest_queued_age_seconds", queue="idle") == 0
    assert value(text, "sluice_queue_dispatched_total", queue="team-a") == 3
    assert value(text, "sluice_queue_dispatched_total", queue="team-b") >= 1
    assert samples(text, "sluice_cluster_reachable") == {(("cluster", "cloud"),): 1, (("cluster", "onprem"),): 1}
    c.cancel(a + b + [waiting])


def test_burst_spend_and_budgets_are_series(sluice):
    s = sluice(OBJECTS)
    c, port, ca = s.client, s.dispatcher.metrics_port, s.tls.ca
    text = scrape(port, ca)
    assert value(text, "sluice_burst_spend_today", policy="to-cloud", queue="") == 0
    assert value(text, "sluice_burst_budget_per_day", policy="to-cloud", queue="") == 1.0
    assert not samples(text, "sluice_burst_budget_per_hour")  # the policy as a whole has no hourly budget

    fillers = c.submit([job("team-a", "1", "600s", name="filler") for _ in range(4)])
    wait_for(lambda: all(c.get(i)["state"] == "RUNNING" for i in fillers), 20, "on-prem full")
    [burst] = c.submit([job("team-b", "2", "600s", name="burst", maxRuntime="1h")])
    wait_for(lambda: c.get(burst)["cluster"] == "cloud", 20, "the burst on the cloud")
    text = scrape(port, ca)
    # 2 cpu x 0.05/h x maxRuntime 1h: 0.10 expected today, at 0.10 an hour, for the policy and team-b.
    for q in ("", "team-b"):
        assert value(text, "sluice_burst_spend_today", policy="to-cloud", queue=q) == pytest.approx(0.10)
        assert value(text, "sluice_burst_spend_rate_per_hour", policy="to-cloud", queue=q) == pytest.approx(0.10)
    assert value(text, "sluice_burst_budget_per_hour", policy="to-cloud", queue="team-b") == 0.5
    c.cancel(fillers + [burst])


def test_submits_are_counted_by_outcome(sluice):
    s = sluice(OBJECTS)
    c, port, ca = s.client, s.dispatcher.metrics_port, s.tls.ca
    before = scrape(port, ca)
    assert {dict(k)["outcome"] for k in samples(before, "sluice_submit_requests_total")} == {
        "accepted", "invalid", "refused", "failed"}  # every outcome has a series from the start
    c.submit([job("idle", "1", "1s") for _ in range(3)])
    c.submit([job("idle", "1", "1s")], key="once")
    c.submit([job("idle", "1", "1s")], key="once")  # a replay: accepted, its job not counted again
    with pytest.raises(ClientError):
        c.submit([job("no-such-queue", "1", "1s")])
    text = scrape(port, ca)
    assert value(text, "sluice_submit_requests_total", outcome="accepted") == 3
    assert value(text, "sluice_submit_requests_total", outcome="invalid") == 1
    assert value(text, "sluice_submit_requests_total", outcome="failed") == 0
    assert value(text, "sluice_submitted_jobs_total") == 4
