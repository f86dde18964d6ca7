"""Burst scenarios through the real dispatcher, Postgres, gRPC and sim agents (issue 6's acceptance).

On-prem is a small cluster filled first; the paid clusters are tier `cloud` with prices. Policy times
(burst `after`, provisioning delays as the dispatcher counts them) are real seconds; pod durations and
the sims' own provisioning are scaled by TIME_SCALE.
"""
from __future__ import annotations

import json
import time
from datetime import datetime

from tests.integration.scenarios import TIME_SCALE, cluster, job, queue, wait_final, wait_for

CLASSES = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500, burst: {allowed: true, after: 3s}}
---
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: batch}
spec: {priority: 100, preemptible: true, burst: {allowed: false}}
"""


def policy(name: str = "to-cloud", **spec) -> str:
    return f"""
---
apiVersion: sluice.io/v1
kind: BurstPolicy
metadata: {{name: {name}}}
spec: {json.dumps({"clusterSelector": {"tier": "cloud"}, **spec})}
"""


def seconds_between(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def fill(client, queue_name: str, cpus: int) -> list[int]:
    """Fill on-prem with 1-cpu jobs that run long (cancelled by the test when done)."""
    ids = client.submit([job(queue_name, "1", "600s", name="filler") for _ in range(cpus)])
    wait_for(lambda: all(client.get(i)["state"] == "RUNNING" for i in ids), 15, "on-prem full")
    return ids


def test_a_standard_job_bursts_to_the_cheaper_cloud_only_after_its_wait_and_a_batch_job_never(sluice):
    s = sluice(CLASSES + queue("q", serviceClasses=["standard", "batch"]) + cluster("onprem", 4)
               + cluster("cloud-a", 8, tier="cloud", site="cloud-1", price={"cpu": 0.10})
               + cluster("cloud-b", 8, tier="cloud", site="cloud-2", price={"cpu": 0.05})
               + policy(after="0s"))
    c = s.client
    fillers = fill(c, "q", 4)
    [standard] = c.submit([job("q", "2", "2s", name="standard")])
    [batch] = c.submit([job("q", "2", "2s", name="batch", service_class="batch")])
    time.sleep(1.5)  # well inside the class's 3 s: still waiting, and saying when it may burst
    waiting = c.get(standard)
    assert waiting["state"] == "QUEUED", waiting
    assert "may burst after waiting 3s" in waiting["reason"], waiting["reason"]
    done = wait_final(c, [standard], 20)[0]
    assert done["state"] == "SUCCEEDED" and done["cluster"] == "cloud-b", done
    waited = seconds_between(done["createdAt"], done["dispatchedAt"])
    assert 3.0 <= waited < 8.0, waited  # the loop looks again at least every 2 s when nothing wakes it
    info = c.explain(standard)
    [burst] = info["bursts"]
    assert (burst["attempt"], burst["policy"], burst["cluster"]) == (1, "to-cloud", "cloud-b")
    assert burst["trigger"].startswith("waited 3s") or burst["trigger"].startswith("waited 4s"), burst["trigger"]
    assert abs(burst["ratePerHour"] - 0.10) < 1e-9 and abs(burst["expectedCost"] - 0.10) < 1e-9  # 2 cpu x 0.05 x 1h
    assert {a["cluster"]: a["verdict"] for a in burst["alternatives"]} == {
        "cloud-a": "fits, expected cost 0.20", "cloud-b": "fits, expected cost 0.10"}
    # The batch job never bursts: it keeps waiting for on-prem, saying why.
    batch_job = c.get(batch)
    assert batch_job["state"] == "QUEUED", batch_job
    assert batch_job["reason"].endswith("; class batch may not burst to paid clusters"), batch_job["reason"]
    assert c.explain(batch)["bursts"] == []
    c.cancel(fillers)
    done = wait_final(c, [batch], 20)[0]
    assert (done["state"], done["cluster"]) == ("SUCCEEDED", "onprem")


def test_no_onprem_start_expected_in_time_bursts_at_once(sluice):
    # The on-prem jobs may run 2 hours (maxRuntime): no on-prem start within the 10 minutes the class
    # asks for, so the job bursts without waiting them.
    classes = CLASSES.replace("after: 3s", "after: 10m")
    s = sluice(classes + queue("q") + cluster("onprem", 4)
               + cluster("cloud", 8, tier="cloud", site="cloud-1", price={"cpu": 0.05}) + policy(after="0s"))
    c = s.client
    fillers = c.submit([job("q", "1", "600s", name="filler", maxRuntime="2h") for _ in range(4)])
    wait_for(lambda: all(c.get(i)["state"] == "RUNNING" for i in fillers), 15, "on-prem full")
    [standard] = c.submit([job("q", "2", "1s", name="standard")])
    done = wait_final(c, [standard], 20)[0]
    assert (done["state"], done["cluster"]) == ("SUCCEEDED", "cloud"), done
    assert seconds_between(done["createdAt"], done["dispatchedAt"]) < 3
    [burst] = c.explain(standard)["bursts"]
    assert burst["trigger"].startswith("no on-prem start expected within 10m (expected in 1h59m") or \
        burst["trigger"].startswith("no on-prem start expected within 10m (expected in 2h"), burst["trigger"]
    c.cancel(fillers)


def test_the_daily_budget_stops_bursting_exactly_at_the_cap(sluice):
    # Each job: 1 cpu x 0.05/h x maxRuntime 1h = 0.05 expected. A budget of 0.15 a day admits exactly 3.
    s = sluice(CLASSES.replace("after: 3s", "after: 0s") + queue("q") + cluster("onprem", 2)
               + cluster("cloud", 16, tier="cloud", site="cloud-1", price={"cpu": 0.05})
               + policy(after="0s", budget={"perDay": 0.15}))
    c = s.client
    fillers = fill(c, "q", 2)
    ids = c.submit([job("q", "1", "600s", name="burst", maxRuntime="1h") for _ in range(5)])
    wait_for(lambda: sum(c.get(i)["state"] == "RUNNING" for i in ids) == 3, 15, "three bursts running")
    time.sleep(1.0)  # several more cycles: still exactly three
    jobs = [c.get(i) for i in ids]
    assert sorted(j["cluster"] or "" for j in jobs) == ["", "", "cloud", "cloud", "cloud"]
    refused = [j for j in jobs if j["state"] == "QUEUED"]
    assert len(refused) == 2
    for j in refused:
        assert "burst refused: cloud: would break policy to-cloud's budget per day " \
               "(0.15 spent today + 0.05 > 0.15)" in j["reason"], j["reason"]
    usage = c.usage(since_s=3600)
    [total] = [b for b in usage["burst"] if b["queue"] is None]
    assert (total["policy"], total["budgetPerDay"]) == ("to-cloud", 0.15)
    assert abs(total["spentToday"] - 0.15) < 1e-9 and abs(total["ratePerHour"] - 0.15) < 1e-9
    c.cancel(ids + fillers)


def test_an_elastic_cluster_at_zero_nodes_scales_up_after_its_delay_and_runs_the_job(sluice):
    # No on-prem cluster can ever hold 6 cpu, so the job bursts at once to the elastic cloud, which has
    # no node yet: it counts the headroom of its maximum size, and the job starts after the delay.
    delay = 20.0  # as the dispatcher counts it; the sim provisions in delay x TIME_SCALE
    s = sluice(CLASSES + queue("q") + cluster("onprem", 4)
               + cluster("grow", 8, nodes=0, tier="cloud", site="cloud-1", price={"cpu": 0.05},
                         elastic={"maxNodes": 2, "provisioningDelay": f"{delay:g}s", "scaleDownAfter": "30s"})
               + policy(after="0s"))
    c = s.client
    sim = s.sims["grow"]
    assert sim.node_count == 0
    [big] = c.submit([job("q", "6", "1s", name="big")])
    dispatched = wait_for(lambda: (j := c.get(big))["state"] == "DISPATCHED" and j, 10, "dispatched to grow")
    assert dispatched["cluster"] == "grow"
    [burst] = c.explain(big)["bursts"]
    assert (burst["trigger"], burst["startsInSeconds"]) == ("no unpaid cluster could ever run it", delay)
    assert {a["cluster"]: a["verdict"] for a in burst["alternatives"]} == {
        "grow": f"fits, expected cost 0.30, starts in {delay:g}s"}
    done = wait_final(c, [big], 30)[0]
    assert (done["state"], done["cluster"]) == ("SUCCEEDED", "grow"), done
    assert seconds_between(done["dispatchedAt"], done["startedAt"]) >= delay * TIME_SCALE * 0.9
    assert sim.node_count == 1 and sim.max_overcommit == {}
