"""Admin objects kept as Kubernetes resources: an admin creates sluice.io Queue and ServiceClass resources in
the management cluster's API server (the CRDs Sluice ships, a fake API server, the real `kubernetes` client);
its agent (a real `sluice agent run` process) hands them to the dispatcher, which applies them as `sluice admin
apply` would, all or nothing; each resource's status says how it went (with a Queue's guaranteed, max and
used); deleting a resource deletes its object, refused while the object is in use. A cluster that is not the
management cluster may not do this (a scripted agent)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client as kube

from dispatcher.services import administering
from sluice.crds import crd
from sluice.objects import load_objects
from sluice.v1 import agents_pb2
from tests.fakekube import FakeKube
from tests.integration.test_agent_link import ScriptedAgent
from tests.integration.test_fuzz import FUZZ, INTERNALS, mutated
from tests.integration.test_kubernetes_agent import Agents, kube_api, running_dispatcher, wait_until

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: default}
spec: {serviceClasses: [standard]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: mgmt}
spec: {tier: onprem, kubernetes: {adminObjects: true}}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: other}
spec: {tier: onprem}
"""


@pytest.fixture
def fake(tmp_path):
    server = FakeKube().start()
    server.add_node("node-0", {"cpu": "8", "memory": "32Gi", "pods": "110"})
    server.add_namespace("research")  # where the research queue's jobs run (their pods stay Pending: no autopilot)
    for kind in ("Queue", "ServiceClass", "Cluster", "BurstPolicy"):
        server.put(crd(kind))
    server.kubeconfig(tmp_path / "mgmt.kubeconfig", context="mgmt")
    yield server
    server.stop()


@pytest.fixture
def dispatcher(db_url, tmp_path):
    with running_dispatcher(db_url, tmp_path, OBJECTS, ("mgmt", "other")) as d:
        yield d


@pytest.fixture
def agents(dispatcher, fake, tmp_path):
    launcher = Agents(dispatcher, tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
def kubectl(fake, tmp_path):
    with kube_api(tmp_path, "mgmt", kube.CustomObjectsApi) as api:
        yield api


def resource(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def create(kubectl, plural: str, body: dict) -> None:
    kubectl.create_cluster_custom_object("sluice.io", "v1", plural, body)


def stored(dispatcher, kind: str) -> dict[str, dict]:
    with dispatcher.sessions() as session:
        return {doc["metadata"]["name"]: doc for doc in administering.get(session, kind)}


def status(fake: FakeKube, plural: str, name: str) -> dict:
    return (fake.get(f"{plural}.sluice.io", "", name) or {}).get("status") or {}


def test_resources_applied_in_the_management_cluster_reach_sluice_and_say_so(dispatcher, fake, kubectl, agents):
    agents.start("mgmt")
    create(kubectl, "serviceclasses", resource("ServiceClass", "batch", {"priority": 100}))
    create(kubectl, "queues", resource("Queue", "research", {
        "guaranteed": {"cpu": "4"}, "max": {"cpu": "8", "memory": "64Gi"}, "weight": 2,
        "serviceClasses": ["batch", "standard"]}))
    wait_until(lambda: status(fake, "queues", "research").get("accepted") is True, 30, what="the queue accepted")
    queue = stored(dispatcher, "Queue")["research"]
    assert queue["spec"]["weight"] == 2 and queue["spec"]["guaranteed"] == {"cpu": "4"}
    assert "batch" in stored(dispatcher, "ServiceClass")
    shown = status(fake, "queues", "research")
    assert (shown["guaranteed"], shown["max"], shown["used"]) == ("cpu=4", "cpu=8,memory=64Gi", "-")
    assert shown["observedGeneration"] == 1
    assert [c["reason"] for c in shown["conditions"] if c["type"] == "Accepted"] == ["Applied"]
    assert "sluice.io/admin-object" in fake.get("queues.sluice.io", "", "research")["metadata"]["finalizers"]
    # A job running in the queue shows in its used column.
    [job_id] = dispatcher.client.submit([{"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "j"},
                                          "spec": {"queue": "research", "podSets": [{"name": "main", "count": 1,
                                                   "template": {"spec": {"containers": [{
                                                       "name": "c", "image": "x", "resources": {
                                                           "requests": {"cpu": "2"}}}]}}}]}}])
    wait_until(lambda: status(fake, "queues", "research").get("used") == "cpu=2", 30,
               what=f"used cpu=2 (it is {status(fake, 'queues', 'research')}; job {dispatcher.client.explain(job_id)})")

    # A set with a resource Sluice refuses is applied not at all, and every resource says why.
    kubectl.patch_cluster_custom_object("sluice.io", "v1", "queues", "research", {"spec": {"weight": 5}})
    create(kubectl, "queues", resource("Queue", "orphan", {"parent": "nowhere"}))
    wait_until(lambda: status(fake, "queues", "orphan").get("accepted") is False, 30, what="the orphan refused")
    assert "nowhere" in status(fake, "queues", "orphan")["message"]
    wait_until(lambda: status(fake, "queues", "research").get("accepted") is False, 30, what="research held back")
    assert stored(dispatcher, "Queue")["research"]["spec"]["weight"] == 2  # not applied: all or nothing
    assert "orphan" not in stored(dispatcher, "Queue")

    # Deleting a resource deletes its object, once nothing uses it; while something does, it waits, saying why.
    kubectl.delete_cluster_custom_object("sluice.io", "v1", "queues", "orphan")
    wait_until(lambda: status(fake, "queues", "research").get("accepted") is True, 30, what="research applied")
    assert stored(dispatcher, "Queue")["research"]["spec"]["weight"] == 5
    kubectl.delete_cluster_custom_object("sluice.io", "v1", "queues", "research")
    wait_until(lambda: "in use" in status(fake, "queues", "research").get("message", ""), 30,
               what="the deletion refused while its job is live")
    assert "research" in stored(dispatcher, "Queue")
    assert fake.get("queues.sluice.io", "", "research")["metadata"]["deletionTimestamp"]
    create(kubectl, "queues", resource("Queue", "scratch", {}))
    wait_until(lambda: "scratch" in stored(dispatcher, "Queue"), 30, what="scratch applied")
    kubectl.delete_cluster_custom_object("sluice.io", "v1", "queues", "scratch")
    wait_until(lambda: fake.get("queues.sluice.io", "", "scratch") is None, 30,
               what=f"the resource gone (status {status(fake, 'queues', 'scratch')})")
    # Gone at once when it went before its finalizer was on; its object follows at the agent's next send.
    wait_until(lambda: "scratch" not in stored(dispatcher, "Queue"), 30, what="scratch deleted from Sluice")
    # A resource that goes without its finalizer (forced off, as an admin may) has its object deleted all the same.
    create(kubectl, "queues", resource("Queue", "fleeting", {}))
    wait_until(lambda: "sluice.io/admin-object" in (fake.get("queues.sluice.io", "", "fleeting") or {}).get(
        "metadata", {}).get("finalizers", []), 30, what="fleeting applied")
    kubectl.patch_cluster_custom_object("sluice.io", "v1", "queues", "fleeting", {"metadata": {"finalizers": None}})
    kubectl.delete_cluster_custom_object("sluice.io", "v1", "queues", "fleeting")
    assert fake.get("queues.sluice.io", "", "fleeting") is None
    wait_until(lambda: "fleeting" not in stored(dispatcher, "Queue"), 30, what="fleeting deleted from Sluice")


def test_a_cluster_that_is_not_the_management_cluster_may_not_change_admin_objects(dispatcher, tmp_path):
    agent = ScriptedAgent(dispatcher.address, (tmp_path / "other.token").read_text(), "other")
    assert agent.next("welcome").takes_admin_resources
    agent.send(admin_resources=agents_pb2.AdminResources(resources=[agents_pb2.AdminResource(
        kind="Queue", name="sneaky", document_json='{"apiVersion": "sluice.io/v1", "kind": "Queue", '
                                                   '"metadata": {"name": "sneaky"}, "spec": {}}')]))
    [outcome] = agent.next("admin_outcomes").outcomes
    assert not outcome.accepted and "is not a management cluster" in outcome.message
    assert "sneaky" not in stored(dispatcher, "Queue")
    agent.close()


def management_agent(dispatcher, tmp_path) -> ScriptedAgent:
    """The agent of cluster `other`, made the management cluster first."""
    from dispatcher.store import clusters as cluster_store
    with dispatcher.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS.replace("name: other}\nspec: {tier: onprem}",
                                                                          "name: other}\nspec: {tier: onprem, "
                                                                          "kubernetes: {adminObjects: true}}")))
    return ScriptedAgent(dispatcher.address, (tmp_path / "other.token").read_text(), "other")


def test_a_resource_named_with_a_nul_character_is_answered_in_words_and_nothing_is_stored(dispatcher, tmp_path):
    agent = management_agent(dispatcher, tmp_path)
    try:
        agent.next("welcome")
        before = stored(dispatcher, "Queue")
        doc = json.dumps(resource("Queue", "nul", {}))
        agent.send(admin_resources=agents_pb2.AdminResources(resources=[
            agents_pb2.AdminResource(kind="Queue", name="n\x00l", document_json=doc),
            agents_pb2.AdminResource(kind="Queue", name="d\x00l", document_json=doc, deleting=True)]))
        applied, deleted = agent.next("admin_outcomes").outcomes
        assert not applied.accepted and "the resource's name contains a NUL character" in applied.message
        assert deleted.accepted and deleted.deleted  # no object can be named so: the resource may go
        assert stored(dispatcher, "Queue") == before
    finally:
        agent.close()


@FUZZ
@given(documents=st.lists(mutated(resource("Queue", "fuzzed", {"guaranteed": {"cpu": "1"}, "weight": 2})),
                          min_size=1, max_size=3), deleting=st.booleans())
def test_fuzzed_resources_are_each_answered_in_words_and_a_refused_set_changes_nothing(dispatcher, tmp_path,
                                                                                     documents, deleting):
    agent = management_agent(dispatcher, tmp_path)
    try:
        agent.next("welcome")
        before = stored(dispatcher, "Queue")
        resources = [agents_pb2.AdminResource(kind="Queue", name=f"q{n}", document_json=json.dumps(doc),
                                              deleting=deleting) for n, doc in enumerate(documents)]
        agent.send(admin_resources=agents_pb2.AdminResources(resources=resources))
        outcomes = agent.next("admin_outcomes").outcomes
        assert [(o.kind, o.name) for o in outcomes] == [(r.kind, r.name) for r in resources]
        for outcome in outcomes:
            assert not INTERNALS.search(outcome.message), outcome.message
        if not all(o.accepted for o in outcomes):
            assert stored(dispatcher, "Queue") == before
    finally:
        agent.close()
