"""What the dispatcher keeps of an agent's messages (dispatcher/api/agents.py): the nodes a capacity report
names, and the nodes a running attempt's report says it holds room on, kept only where they can be trusted
and stored."""
from __future__ import annotations

from dispatcher.api.agents import capacity_document, report_of
from sluice.v1 import agents_pb2, jobs_pb2

GPU = "nvidia.com/gpu"


def capacity(names: list[str], nodes: int = 2) -> agents_pb2.Capacity:
    room = jobs_pb2.Resources(milli={GPU: 8000})
    return agents_pb2.Capacity(free=jobs_pb2.Resources(milli={GPU: 8000 * nodes}), node_free=[room] * nodes,
                               node_names=names)


def test_a_capacity_report_s_node_names_are_kept_when_they_pair_up_one_to_one_with_its_nodes():
    assert capacity_document(capacity(["n0", "n1"]))["nodeNames"] == ["n0", "n1"]
    for names in ([], ["n0"], ["n0", "n1", "n2"], ["n0", "n0"], ["n0", "n\x001"]):
        document = capacity_document(capacity(names))
        assert "nodeNames" not in document and len(document["nodeFree"]) == 2  # the room per node stays
    assert "nodeNames" not in capacity_document(capacity(["n0"], nodes=0))  # names without nodes: nothing


def test_a_running_report_s_nodes_are_kept_unless_they_cannot_be_stored_or_name_a_node_twice():
    def report(*nodes: tuple[str, dict]) -> agents_pb2.AttemptStatus:
        return agents_pb2.AttemptStatus(job_id=7, attempt=1, state="RUNNING", nodes=[
            agents_pb2.NodeRoom(node=node, held=jobs_pb2.Resources(milli=held)) for node, held in nodes])

    assert report_of(report(("n0", {GPU: 2000}), ("n1", {GPU: 6000}))).nodes == \
        (("n0", {GPU: 2000}), ("n1", {GPU: 6000}))
    assert report_of(report()).nodes == ()  # not said: what is stored stays
    for bad in ((("n0", {GPU: 1}), ("n0", {GPU: 1})), (("n\x000", {GPU: 1}),), (("n0", {"g\x00pu": 1}),)):
        found = report_of(report(*bad))
        assert found.nodes == () and found.state == "RUNNING"  # the rest of the report is applied
