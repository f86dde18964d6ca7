"""Admin objects: docs/api.md's examples, defaults, every validation rule, and round trips."""
import json
from pathlib import Path

import pytest
import yaml

from sluice.objects import (
    KINDS,
    BurstPolicyObject,
    ClusterObject,
    QueueObject,
    ServiceClassObject,
    SimulatedSpec,
    default_objects,
    kind_named,
    load_objects,
    object_from_document,
)
from sluice.quantity import parse_resources
from sluice.spec import SpecError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GI = 2**30 * 1000  # one Gi in milli-units

API_EXAMPLE = """
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: vision}
spec:
  parent: research
  guaranteed: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8"}
  max: {cpu: "128", memory: 512Gi, nvidia.com/gpu: "16"}
  weight: 1
  members: [alice, bob]
  serviceClasses: [critical, standard, batch]
---
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec:
  priority: 500
  preemptible: false
  canPreempt: false
  weight: 1
  reservationAfter: 30m
  priceMultiplier: 1.0
  burst: {allowed: true, after: 10m}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata:
  name: onprem-a
  labels: {region: eu}
spec:
  tier: onprem
  site: dc-1
  leaseDuration: 5m
  price: {nvidia.com/gpu: 0, cpu: 0, memory: 0}
  prometheus: {url: "http://127.0.0.1:9090", selector: '{cluster="onprem-a"}'}
  elastic: {maxNodes: 20, provisioningDelay: 90s}
  podPolicy: {allowPrivileged: false, allowHostPath: false, allowHostNetwork: false}
  simulated:
    nodes: 4
    node: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "8"}
---
apiVersion: sluice.io/v1
kind: BurstPolicy
metadata: {name: gpu-burst}
spec:
  queues: [vision]
  serviceClasses: [critical, standard]
  clusterSelector: {tier: cloud}
  after: 10m
  budget: {perHour: 50, perDay: 800}
  maxResources: {nvidia.com/gpu: "32"}
"""


def test_api_example():
    queue, service_class, cluster, burst = load_objects(API_EXAMPLE)
    assert queue == QueueObject(
        name="vision", parent="research",
        guaranteed={"cpu": 64000, "memory": 256 * GI, "nvidia.com/gpu": 8000},
        max={"cpu": 128000, "memory": 512 * GI, "nvidia.com/gpu": 16000},
        weight=1.0, members=("alice", "bob"), service_classes=("critical", "standard", "batch"))
    assert service_class == ServiceClassObject(
        name="standard", priority=500, preemptible=False, can_preempt=False, weight=1.0, reservation_after_s=1800.0,
        price_multiplier=1.0, burst_allowed=True, burst_after_s=600.0)
    assert cluster == ClusterObject(
        name="onprem-a", labels={"region": "eu"}, tier="onprem", site="dc-1", lease_duration_s=300.0,
        price={"nvidia.com/gpu": 0.0, "cpu": 0.0, "memory": 0.0},
        prometheus={"url": "http://127.0.0.1:9090", "selector": '{cluster="onprem-a"}'},
        elastic={"maxNodes": 20, "provisioningDelay": 90.0, "scaleDownAfter": 600.0,
                 "node": parse_resources({"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"})},
        simulated=SimulatedSpec(nodes=4, node={"cpu": 32000, "memory": 128 * GI, "nvidia.com/gpu": 8000}))
    assert burst == BurstPolicyObject(
        name="gpu-burst", queues=("vision",), service_classes=("critical", "standard"),
        cluster_selector={"tier": "cloud"}, after_s=600.0, budget_per_hour=50.0, budget_per_day=800.0,
        max_resources={"nvidia.com/gpu": 32000})


def test_a_top_level_queue_may_remember_usage_with_a_half_life():
    queue = object_from_document(doc("Queue", {"usageHalfLife": "90m"}))
    assert queue.usage_half_life_s == 5400.0
    assert queue.to_document()["spec"]["usageHalfLife"] == "90m"
    assert "usageHalfLife" not in QueueObject("x").to_document()["spec"]  # off unless set


@pytest.mark.parametrize("obj", [*load_objects(API_EXAMPLE), *default_objects(),
                                 QueueObject("org", usage_half_life_s=7200.0)], ids=lambda o: f"{o.kind}-{o.name}")
def test_to_document_round_trips(obj):
    document = obj.to_document()
    assert document["apiVersion"] == "sluice.io/v1" and document["kind"] == obj.kind
    assert object_from_document(document) == obj
    assert object_from_document(json.loads(json.dumps(document))) == obj
    assert object_from_document(yaml.safe_load(yaml.safe_dump(document))) == obj


def test_api_example_documents_are_canonical():
    for obj, doc in zip(load_objects(API_EXAMPLE), yaml.safe_load_all(API_EXAMPLE)):
        canonical = obj.to_document()
        assert canonical["metadata"]["name"] == doc["metadata"]["name"]
        assert set(doc["spec"]) <= set(canonical["spec"])


def test_defaults():
    def minimal(kind, **metadata):
        return object_from_document({"apiVersion": "sluice.io/v1", "kind": kind, "metadata": {"name": "x", **metadata}})

    assert minimal("Queue") == QueueObject("x", parent=None, guaranteed={}, max={}, weight=1.0, members=(),
                                           service_classes=(), usage_half_life_s=None)
    assert minimal("ServiceClass") == ServiceClassObject("x", priority=0, preemptible=False, can_preempt=False,
                                                         weight=1.0, reservation_after_s=None, price_multiplier=1.0,
                                                         burst_allowed=False, burst_after_s=None)
    cluster = minimal("Cluster")
    assert cluster == ClusterObject("x", labels={}, tier="onprem", site="", lease_duration_s=300.0, price={},
                                    prometheus=None, elastic=None, simulated=None)
    assert minimal("BurstPolicy") == BurstPolicyObject("x", queues=(), service_classes=(), cluster_selector={},
                                                       after_s=0.0, budget_per_hour=None, budget_per_day=None,
                                                       max_resources={})


@pytest.mark.parametrize("tier, lease", [("onprem", 300.0), ("cloud", 300.0), ("edge", 4 * 3600.0)])
def test_lease_duration_depends_on_the_tier(tier, lease):
    doc = {"apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": "c"}, "spec": {"tier": tier}}
    assert object_from_document(doc).lease_duration_s == lease
    assert ClusterObject("c", tier=tier).lease_duration_s == lease
    doc["spec"]["leaseDuration"] = "1m"
    assert object_from_document(doc).lease_duration_s == 60.0


def test_elastic_provisioning_delay_defaults_to_zero():
    doc = {"apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": "c"},
           "spec": {"elastic": {"maxNodes": 3}}}
    assert object_from_document(doc).elastic == {"maxNodes": 3, "provisioningDelay": 0.0, "scaleDownAfter": 600.0,
                                                 "node": {}}


def test_default_objects():
    objects = default_objects()
    by_name = {(o.kind, o.name): o for o in objects}
    assert len(by_name) == len(objects) == 8
    critical, standard, batch = (by_name["ServiceClass", n] for n in ("critical", "standard", "batch"))
    assert (critical.priority, critical.can_preempt, critical.preemptible) == (1000, True, False)
    assert (standard.priority, standard.burst_allowed, standard.burst_after_s) == (500, True, 600.0)
    assert (batch.priority, batch.preemptible, batch.burst_allowed) == (100, True, False)
    queue = by_name["Queue", "default"]
    assert (queue.guaranteed, queue.max, queue.service_classes[0]) == ({}, {}, "standard")
    assert set(queue.service_classes) == {"critical", "standard", "batch"}
    onprem, cloud, edge = (by_name["Cluster", n] for n in ("onprem", "cloud", "edge"))
    assert (onprem.tier, onprem.site, onprem.lease_duration_s, onprem.price) == ("onprem", "dc-1", 300.0, {})
    assert onprem.simulated == SimulatedSpec(4, {"cpu": 32000, "memory": 128 * GI, "nvidia.com/gpu": 8000})
    assert (cloud.tier, cloud.site, cloud.lease_duration_s) == ("cloud", "cloud-1", 300.0)
    assert cloud.price == {"cpu": 0.04, "memory": 0.005, "nvidia.com/gpu": 2.5}
    assert cloud.simulated == SimulatedSpec(4, {"cpu": 16000, "memory": 64 * GI})
    assert (edge.tier, edge.site, edge.lease_duration_s) == ("edge", "edge-1", 4 * 3600.0)
    assert edge.simulated == SimulatedSpec(2, {"cpu": 8000, "memory": 32 * GI})
    burst = by_name["BurstPolicy", "cloud-burst"]
    assert (burst.cluster_selector, burst.after_s, burst.budget_per_hour, burst.budget_per_day) == \
        ({"tier": "cloud"}, 0.0, 25.0, 200.0)


def test_example_cluster_config_is_the_defaults():
    assert load_objects((EXAMPLES / "cluster-config.yaml").read_text()) == default_objects()


def test_default_objects_are_fresh_values():
    default_objects()[4].simulated.node["cpu"] = 1
    assert default_objects()[4].simulated.node["cpu"] == 32000


# -- validation --------------------------------------------------------------------------------------

def doc(kind, spec=None, **metadata):
    out = {"apiVersion": "sluice.io/v1", "kind": kind, "metadata": {"name": "x", **metadata}}
    if spec is not None:
        out["spec"] = spec
    return out


def error(document) -> SpecError:
    with pytest.raises(SpecError) as info:
        object_from_document(document)
    return info.value


NAME_RULE = ("is not a valid name (lowercase letters, digits, '-', '_' and '.', starting and ending with a "
             "letter or digit)")


# Every rule, as (document, the path its error names, the message); tests/unit/test_crds.py checks the
# CustomResourceDefinitions' schemas refuse them too, where a schema can say the rule.
INVALID_DOCUMENTS = [
    # envelope
    ({"apiVersion": "v1", "kind": "Queue"}, "apiVersion", "must be sluice.io/v1, got string 'v1'"),
    ({"kind": "Queue"}, "apiVersion", "must be sluice.io/v1, got null"),
    ({"apiVersion": "sluice.io/v1", "kind": "Qeue"}, "kind",
     "unknown kind string 'Qeue', known: BurstPolicy, Cluster, Queue, ServiceClass"),
    ({"apiVersion": "sluice.io/v1"}, "kind", "unknown kind null, known: BurstPolicy, Cluster, Queue, ServiceClass"),
    ({"apiVersion": "sluice.io/v1", "kind": "Job"}, "kind",
     "unknown kind string 'Job', known: BurstPolicy, Cluster, Queue, ServiceClass (jobs are submitted with "
     "`sluice submit`)"),
    ({"apiVersion": "sluice.io/v1", "kind": "Queue"}, "metadata", "required"),
    ({"apiVersion": "sluice.io/v1", "kind": "Queue", "metadata": {}}, "metadata.name", "required"),
    (doc("Queue") | {"status": {}}, "status", "unknown field (known: apiVersion, kind, metadata, spec)"),
    (doc("Queue", labels={"a": "b"}), "metadata.labels", "unknown field (known: name)"),
    ({"apiVersion": "sluice.io/v1", "kind": "Queue", "metadata": {"name": "Vision"}}, "metadata.name",
     f"'Vision' {NAME_RULE}"),
    (doc("Queue", []), "spec", "must be a mapping, got list"),
    # Queue
    (doc("Queue", {"guaranted": {}}), "spec.guaranted", "unknown field (did you mean guaranteed?)"),
    (doc("Queue", {"parent": "Research"}), "spec.parent", f"'Research' {NAME_RULE}"),
    (doc("Queue", {"parent": "x"}), "spec.parent", "a queue cannot be its own parent"),
    (doc("Queue", {"guaranteed": {"cpu": "lots"}}), "spec.guaranteed.cpu",
     "'lots' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
    (doc("Queue", {"guaranteed": ["cpu"]}), "spec.guaranteed", "must be a mapping, got list"),
    (doc("Queue", {"max": {"memory": "-1Gi"}}), "spec.max.memory",
     "'-1Gi' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
    (doc("Queue", {"guaranteed": {"cpu": "129"}, "max": {"cpu": "128"}}), "spec.guaranteed.cpu",
     "must not exceed spec.max.cpu (128)"),
    (doc("Queue", {"weight": 0}), "spec.weight", "must be greater than 0"),
    (doc("Queue", {"weight": "1"}), "spec.weight", "must be a number, got string '1'"),
    (doc("Queue", {"weight": True}), "spec.weight", "must be a number, got boolean True"),
    (doc("Queue", {"weight": float("nan")}), "spec.weight", "must be a finite number"),
    (doc("Queue", {"members": "alice"}), "spec.members", "must be a list, got string 'alice'"),
    (doc("Queue", {"members": ["alice", ""]}), "spec.members[1]", "must not be empty"),
    (doc("Queue", {"serviceClasses": ["standard", "standard"]}), "spec.serviceClasses[1]",
     "'standard' is listed twice"),
    (doc("Queue", {"serviceClasses": ["Gold"]}), "spec.serviceClasses[0]", f"'Gold' {NAME_RULE}"),
    (doc("Queue", {"usageHalfLife": "0s"}), "spec.usageHalfLife", "must be longer than 0s"),
    (doc("Queue", {"usageHalfLife": "a while"}), "spec.usageHalfLife",
     "'a while' is not a duration (examples: '90s', '10m', '2h', '1d')"),
    (doc("Queue", {"parent": "org", "usageHalfLife": "1h"}), "spec.usageHalfLife",
     "only a top-level queue (no spec.parent) sets it: it applies to the whole tree below that queue"),
    # ServiceClass
    (doc("ServiceClass", {"priority": 1001}), "spec.priority", "must be at most 1000"),
    (doc("ServiceClass", {"priority": "high"}), "spec.priority", "must be an integer, got string 'high'"),
    (doc("ServiceClass", {"preemptible": "yes"}), "spec.preemptible", "must be true or false, got string 'yes'"),
    (doc("ServiceClass", {"canPreempt": 1}), "spec.canPreempt", "must be true or false, got integer 1"),
    (doc("ServiceClass", {"canpreempt": True}), "spec.canpreempt", "unknown field (did you mean canPreempt?)"),
    (doc("ServiceClass", {"weight": -1}), "spec.weight", "must be greater than 0"),
    (doc("ServiceClass", {"reservationAfter": "soon"}), "spec.reservationAfter",
     "'soon' is not a duration (examples: '90s', '10m', '2h', '1d')"),
    (doc("ServiceClass", {"priceMultiplier": -0.5}), "spec.priceMultiplier", "must be at least 0"),
    (doc("ServiceClass", {"burst": True}), "spec.burst", "must be a mapping, got boolean True"),
    (doc("ServiceClass", {"burst": {"allow": True}}), "spec.burst.allow", "unknown field (did you mean allowed?)"),
    (doc("ServiceClass", {"burst": {"allowed": "true"}}), "spec.burst.allowed",
     "must be true or false, got string 'true'"),
    (doc("ServiceClass", {"burst": {"after": -1}}), "spec.burst.after", "duration -1 is negative"),
    # Cluster
    (doc("Cluster", {"tier": "space"}), "spec.tier", "must be one of onprem, cloud, edge, got string 'space'"),
    (doc("Cluster", {"site": 1}), "spec.site", 'must be a string, got integer 1 (quote it: "1")'),
    (doc("Cluster", {"leaseDuration": "0s"}), "spec.leaseDuration", "must be longer than 0s"),
    (doc("Cluster", labels={"region": 1}), "metadata.labels.region", 'must be a string, got integer 1 (quote it: "1")'),
    (doc("Cluster", {"price": {"cpu": -1}}), "spec.price.cpu", "must be at least 0"),
    (doc("Cluster", {"price": {"cpu": "0.04"}}), "spec.price.cpu", "must be a number, got string '0.04'"),
    (doc("Cluster", {"price": {1: 0.04}}), "spec.price", "must be a string, got integer 1 (quote it: \"1\")"),
    (doc("Cluster", {"prometheus": {"selector": "x"}}), "spec.prometheus.url", "required"),
    (doc("Cluster", {"prometheus": {"url": "127.0.0.1:9090"}}), "spec.prometheus.url",
     "must be an http:// or https:// URL, got '127.0.0.1:9090'"),
    (doc("Cluster", {"prometheus": {"url": "http://p", "query": "x"}}), "spec.prometheus.query",
     "unknown field (did you mean queries?)"),
    (doc("Cluster", {"prometheus": {"url": "http://p", "selector": 3}}), "spec.prometheus.selector",
     'must be a string, got integer 3 (quote it: "3")'),
    (doc("Cluster", {"elastic": {}}), "spec.elastic.maxNodes", "required"),
    (doc("Cluster", {"elastic": {"maxNodes": 0}}), "spec.elastic.maxNodes", "must be at least 1"),
    (doc("Cluster", {"elastic": {"maxNodes": 2, "provisioningDelay": "fast"}}), "spec.elastic.provisioningDelay",
     "'fast' is not a duration (examples: '90s', '10m', '2h', '1d')"),
    (doc("Cluster", {"podPolicy": {"allowPriviledged": True}}), "spec.podPolicy.allowPriviledged",
     "unknown field (did you mean allowPrivileged?)"),
    (doc("Cluster", {"elastic": {"maxNodes": 1}, "simulated": {"nodes": 2, "node": {"cpu": "1"}}}),
     "spec.elastic.maxNodes", "must be at least spec.simulated.nodes (2)"),
    (doc("Cluster", {"simulated": {"nodes": 0, "node": {"cpu": "1"}}}), "spec.simulated.nodes",
     "must be at least 1 unless the cluster is elastic"),
    (doc("Cluster", {"elastic": {"maxNodes": 2, "node": {"cpu": "lots"}}}), "spec.elastic.node.cpu",
     "'lots' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
    (doc("Cluster", {"kubernetes": {"workload": "deployments"}}), "spec.kubernetes.workload",
     "must be one of pods, jobs, got string 'deployments'"),
    (doc("Cluster", {"kubernetes": {"gangStartTimeout": "0s"}}), "spec.kubernetes.gangStartTimeout",
     "must be longer than 0s"),
    (doc("Cluster", {"kubernetes": {"namespaces": {"vision": "ml_team"}}}), "spec.kubernetes.namespaces.vision",
     "'ml_team' is not a Kubernetes namespace name (lowercase letters, digits and '-', at most 63)"),
    (doc("Cluster", {"kubernetes": {"createNamespaces": "yes"}}), "spec.kubernetes.createNamespaces",
     "must be true or false, got string 'yes'"),
    (doc("Cluster", {"podPolicy": {"serviceAccounts": "default"}}), "spec.podPolicy.serviceAccounts",
     "must be a list, got string 'default'"),
    (doc("Cluster", {"podPolicy": {"allowHostPath": "no"}}), "spec.podPolicy.allowHostPath",
     "must be true or false, got string 'no'"),
    (doc("Cluster", {"simulated": {"node": {"cpu": 1}}}), "spec.simulated.nodes", "required"),
    (doc("Cluster", {"simulated": {"nodes": -1, "node": {"cpu": 1}}}), "spec.simulated.nodes", "must be at least 0"),
    (doc("Cluster", {"simulated": {"nodes": 1}}), "spec.simulated.node", "required"),
    (doc("Cluster", {"simulated": {"nodes": 1, "node": {}}}), "spec.simulated.node",
     "must name at least one resource"),
    (doc("Cluster", {"simulated": {"nodes": 1, "node": {"memory": "1GiB"}}}), "spec.simulated.node.memory",
     "'1GiB' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
    (doc("Cluster", {"simulated": {"nodes": 1, "node": {"cpu": 1}, "gpus": 1}}), "spec.simulated.gpus",
     "unknown field (known: nodes, node)"),
    # BurstPolicy
    (doc("BurstPolicy", {"queues": ["Vision"]}), "spec.queues[0]", f"'Vision' {NAME_RULE}"),
    (doc("BurstPolicy", {"serviceClasses": "standard"}), "spec.serviceClasses",
     "must be a list, got string 'standard'"),
    (doc("BurstPolicy", {"clusterSelector": {"tier": ["cloud"]}}), "spec.clusterSelector.tier",
     "must be a string, got list"),
    (doc("BurstPolicy", {"after": "later"}), "spec.after",
     "'later' is not a duration (examples: '90s', '10m', '2h', '1d')"),
    (doc("BurstPolicy", {"budget": {"perHour": -1}}), "spec.budget.perHour", "must be at least 0"),
    (doc("BurstPolicy", {"budget": {"perhour": 1}}), "spec.budget.perhour", "unknown field (did you mean perHour?)"),
    (doc("BurstPolicy", {"budget": {"perWeek": 1}}), "spec.budget.perWeek", "unknown field (known: perHour, perDay)"),
    (doc("BurstPolicy", {"budget": {"perDay": "800"}}), "spec.budget.perDay", "must be a number, got string '800'"),
    (doc("BurstPolicy", {"maxResources": {"nvidia.com/gpu": "many"}}), "spec.maxResources.nvidia.com/gpu",
     "'many' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
]


@pytest.mark.parametrize("document, path, message", INVALID_DOCUMENTS)
def test_validation(document, path, message):
    err = error(document)
    assert (err.path, err.message) == (path, message)


def test_document_must_be_a_mapping():
    err = error("Queue")
    assert (err.path, err.message) == ("", "must be a mapping, got string 'Queue'")


def test_load_objects_names_the_source_and_document():
    text = yaml.safe_dump_all([doc("Queue"), None, doc("Cluster", {"tier": "moon"})])
    with pytest.raises(SpecError) as info:
        load_objects(text, source="config.yaml")
    assert (info.value.source, info.value.document, info.value.path) == ("config.yaml", 3, "spec.tier")
    assert str(info.value) == "config.yaml document 3: spec.tier: must be one of onprem, cloud, edge, got string 'moon'"


def test_load_objects_reads_json():
    objects = load_objects(json.dumps([o.to_document() for o in default_objects()]))
    assert objects == default_objects()


def test_object_from_document_locates_its_errors():
    with pytest.raises(SpecError) as info:
        object_from_document(doc("Queue", {"weight": -1}), document=2, source="a.yaml")
    assert str(info.value) == "a.yaml document 2: spec.weight: must be greater than 0"


def test_kinds():
    assert sorted(KINDS) == ["BurstPolicy", "Cluster", "Queue", "ServiceClass"]
    assert all(KINDS[kind].kind == kind for kind in KINDS)


@pytest.mark.parametrize("word, kind", [
    ("queue", "Queue"), ("Queues", "Queue"), ("QUEUE", "Queue"), ("class", "ServiceClass"),
    ("classes", "ServiceClass"), ("serviceclass", "ServiceClass"), ("ServiceClasses", "ServiceClass"),
    ("service-class", "ServiceClass"), ("cluster", "Cluster"), ("clusters", "Cluster"),
    ("burstpolicy", "BurstPolicy"), ("BurstPolicies", "BurstPolicy"), ("burst_policy", "BurstPolicy"),
    ("job", None), ("", None), ("queuez", None)])
def test_kinds_are_named_in_any_case_and_plural(word, kind):
    assert kind_named(word) == kind
    if kind:
        assert kind_named(kind) == kind


@pytest.mark.parametrize("kind", [{"name": "Queue"}, ["Queue"], 7, None])
def test_a_kind_that_is_no_string_is_a_clear_error_not_a_crash(kind):
    with pytest.raises(SpecError, match="kind: unknown kind"):
        object_from_document({"apiVersion": "sluice.io/v1", "kind": kind, "metadata": {"name": "q"}})


def test_a_name_with_a_trailing_newline_is_refused():
    from sluice._validate import SpecError, name
    with pytest.raises(SpecError, match="is not a valid name"):
        name("vision\n", "metadata.name")
