"""Issue 24, defect 3, through the real path: agents report each node's free capacity in their heartbeats
(Capacity.node_free over gRPC), the dispatcher stores it with the capacity, the cycle packs a gang's stored
pods onto those nodes, and `sluice explain` gives the same reason the job waits with."""
from __future__ import annotations

from sluice.v1 import agents_pb2, jobs_pb2
from tests.integration.test_agent_link import ScriptedAgent, dispatcher, wait_for  # noqa: F401 (fixture)
from tests.integration.test_spine import job_doc

REASON = "needs 3 pods of 5 cpu at once, only 2 fit on its nodes"


def capacity_of(*node_cpus: int) -> agents_pb2.Capacity:
    nodes = [jobs_pb2.Resources(milli={"cpu": n * 1000}) for n in node_cpus]
    total = {"cpu": sum(node_cpus) * 1000}
    return agents_pb2.Capacity(allocatable=jobs_pb2.Resources(milli=total), free=jobs_pb2.Resources(milli=total),
                               largest_free_node=jobs_pb2.Resources(milli={"cpu": max(node_cpus) * 1000}),
                               node_free=nodes)


def test_a_gang_waits_where_its_pods_do_not_pack_and_goes_where_they_do(dispatcher):  # noqa: F811
    alpha = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    alpha.next("welcome")
    alpha.send(heartbeat=agents_pb2.Heartbeat(capacity=capacity_of(8, 8)))  # 16 free, 8 on the largest node
    wait_for(lambda: {c["name"]: c["free"].get("cpu") for c in dispatcher.client.clusters()}.get("alpha") == "16")
    [job_id] = dispatcher.client.submit([job_doc(cpu="5", count=3)])
    wait_for(lambda: REASON in dispatcher.client.get(job_id)["reason"])
    assert dispatcher.client.get(job_id)["state"] == "QUEUED"
    verdicts = {c["cluster"]: c["verdict"] for c in dispatcher.client.explain(job_id)["clusters"]}
    assert verdicts["alpha"] == REASON
    beta = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["beta"], "beta")
    beta.next("welcome")
    beta.send(heartbeat=agents_pb2.Heartbeat(capacity=capacity_of(5, 5, 5, 5)))
    command = beta.next("command")
    assert command.dispatch.job_id == job_id
    assert dispatcher.client.get(job_id)["cluster"] == "beta"
    # A one-pod job of 8 cpu still goes to alpha's largest node.
    [single] = dispatcher.client.submit([job_doc(cpu="8")])
    assert alpha.next("command").dispatch.job_id == single
    alpha.close()
    beta.close()
