"""Admin objects: Queue, ServiceClass, Cluster and BurstPolicy documents as frozen values (docs/api.md).

`sluice admin apply -f` and `sluice up --config` read these with load_objects(); default_objects() is
what `sluice up` runs without a config. Validation is as strict as for job files (sluice.spec): unknown
fields are errors and every error is one SpecError naming the document and field, e.g.
'spec.guaranteed.cpu'. Resource amounts are milli-units and durations seconds, as everywhere in Sluice;
to_document() writes the canonical form back (JSON- and YAML-safe), and object_from_document() reads it
to an equal object.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from sluice import _validate as v
from sluice._validate import SpecError
from sluice.documents import parse_numbered_documents
from sluice.quantity import format_duration_exact, format_quantity, format_resources, parse_resources
from sluice.spec import API_VERSION, MAX_PRIORITY, MIN_PRIORITY, TIERS

__all__ = [
    "QueueObject", "ServiceClassObject", "SimulatedSpec", "ClusterObject", "BurstPolicyObject", "AdminObject",
    "KINDS", "kind_named", "object_from_document", "load_objects", "default_objects", "default_lease_duration_s",
]

MAX_NODES = 10_000
MAX_SITE_LENGTH = 63
MAX_PROMETHEUS_RETRIES = 10
POD_POLICY_FIELDS = ("allowPrivileged", "allowHostPath", "allowHostNetwork", "allowHostPID")
WORKLOADS = ("pods", "jobs")  # what the kubernetes agent creates per pod set
DEFAULT_GANG_START_TIMEOUT_S = 300.0
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Kubernetes namespace name, matched whole

# The fields of the mappings inside a spec, as the parsers below check them; sluice.crds describes the same
# fields in the CustomResourceDefinitions (a field one knows and the other does not fails there).
BURST_FIELDS = ("allowed", "after")
POD_POLICY_SPEC_FIELDS = POD_POLICY_FIELDS + ("serviceAccounts",)
PROMETHEUS_FIELDS = ("url", "selector", "timeout", "retries", "headers", "queries")
ELASTIC_FIELDS = ("maxNodes", "provisioningDelay", "scaleDownAfter", "node")
KUBERNETES_FIELDS = ("namespaces", "createNamespaces", "gangStartTimeout", "workload", "intake", "adminObjects")
INTAKE_FIELDS = ("user", "queues")
SIMULATED_FIELDS = ("nodes", "node")
BUDGET_FIELDS = ("perHour", "perDay")
PER_QUEUE_FIELDS = ("budget", "maxResources")


def default_lease_duration_s(tier: str) -> float:
    # Edge sites lose their uplink for hours without their jobs being lost.
    return 4 * 3600.0 if tier == "edge" else 5 * 60.0


def _document(kind: str, name: str, spec: dict, labels: dict[str, str] | None = None) -> dict:
    metadata: dict = {"name": name}
    if labels is not None:
        metadata["labels"] = dict(labels)
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


class _Kind:
    """An admin object's kind: its `kind:` word and the fields its document's spec may hold, given where the
    class is declared (`class QueueObject(_Kind, kind="Queue", spec_fields=(...))`)."""

    kind: ClassVar[str]
    spec_fields: ClassVar[tuple[str, ...]]

    def __init_subclass__(cls, *, kind: str, spec_fields: tuple[str, ...], **rest) -> None:
        super().__init_subclass__(**rest)
        cls.kind, cls.spec_fields = kind, spec_fields


@dataclass(frozen=True)
class QueueObject(_Kind, kind="Queue",
                  spec_fields=("parent", "guaranteed", "max", "weight", "members", "serviceClasses",
                               "usageHalfLife")):
    name: str
    parent: str | None = None
    guaranteed: dict[str, int] = field(default_factory=dict)  # milli-units
    max: dict[str, int] = field(default_factory=dict)  # milli-units; a resource not named is unlimited
    weight: float = 1.0  # fair-share weight among siblings
    members: tuple[str, ...] = ()  # users who may submit; () means anyone
    service_classes: tuple[str, ...] = ()  # accepted classes, first is the default; () means all
    # Seconds; only on a top-level queue: its whole tree's fair share remembers usage. None: no memory.
    usage_half_life_s: float | None = None

    def to_document(self) -> dict:
        spec: dict = {}
        if self.parent is not None:
            spec["parent"] = self.parent
        spec.update(guaranteed=format_resources(self.guaranteed), max=format_resources(self.max),
                    weight=self.weight, members=list(self.members), serviceClasses=list(self.service_classes))
        if self.usage_half_life_s is not None:
            spec["usageHalfLife"] = format_duration_exact(self.usage_half_life_s)
        return _document(self.kind, self.name, spec)

    @classmethod
    def from_spec(cls, name: str, metadata: dict, spec: dict) -> QueueObject:
        parent = v.optional(v.name, spec.get("parent"), "spec.parent")
        if parent == name:
            raise SpecError("spec.parent", "a queue cannot be its own parent")
        guaranteed = v.resources(spec.get("guaranteed"), "spec.guaranteed")
        maximum = v.resources(spec.get("max"), "spec.max")
        for resource, amount in guaranteed.items():
            if resource in maximum and amount > maximum[resource]:
                raise SpecError(f"spec.guaranteed.{resource}", "must not exceed spec.max."
                                f"{resource} ({format_quantity(resource, maximum[resource])})")
        half_life = v.optional(v.duration, spec.get("usageHalfLife"), "spec.usageHalfLife", positive=True)
        if half_life is not None and parent is not None:
            raise SpecError("spec.usageHalfLife", "only a top-level queue (no spec.parent) sets it: it applies to "
                            "the whole tree below that queue")
        return cls(
            name=name, parent=parent, guaranteed=guaranteed, max=maximum,
            weight=v.number(v.get(spec, "weight", 1), "spec.weight", positive=True),
            members=v.strings(spec.get("members"), "spec.members"),
            service_classes=v.unique_names(spec.get("serviceClasses"), "spec.serviceClasses"),
            usage_half_life_s=half_life,
        )


@dataclass(frozen=True)
class ServiceClassObject(_Kind, kind="ServiceClass",
                         spec_fields=("priority", "preemptible", "canPreempt", "weight", "reservationAfter",
                                      "priceMultiplier", "burst")):
    name: str
    priority: int = 0  # MIN_PRIORITY..MAX_PRIORITY; higher goes first
    preemptible: bool = False  # may be evicted to make room
    can_preempt: bool = False  # may evict preemptible lower-priority jobs
    weight: float = 1.0  # fair-share weight multiplier
    reservation_after_s: float | None = None  # seconds waited before capacity is reserved; None: never
    price_multiplier: float = 1.0  # chargeback
    burst_allowed: bool = False  # may spill to paid clusters
    burst_after_s: float | None = None  # ... after waiting this long (seconds); None: no class minimum

    def to_document(self) -> dict:
        spec: dict = {"priority": self.priority, "preemptible": self.preemptible, "canPreempt": self.can_preempt,
                      "weight": self.weight}
        if self.reservation_after_s is not None:
            spec["reservationAfter"] = format_duration_exact(self.reservation_after_s)
        spec["priceMultiplier"] = self.price_multiplier
        spec["burst"] = {"allowed": self.burst_allowed}
        if self.burst_after_s is not None:
            spec["burst"]["after"] = format_duration_exact(self.burst_after_s)
        return _document(self.kind, self.name, spec)

    @classmethod
    def from_spec(cls, name: str, metadata: dict, spec: dict) -> ServiceClassObject:
        burst = v.mapping(spec.get("burst"), "spec.burst", allowed=BURST_FIELDS)
        return cls(
            name=name,
            priority=v.integer(v.get(spec, "priority", 0), "spec.priority", MIN_PRIORITY, MAX_PRIORITY),
            preemptible=v.boolean(v.get(spec, "preemptible", False), "spec.preemptible"),
            can_preempt=v.boolean(v.get(spec, "canPreempt", False), "spec.canPreempt"),
            weight=v.number(v.get(spec, "weight", 1), "spec.weight", positive=True),
            reservation_after_s=v.optional(v.duration, spec.get("reservationAfter"), "spec.reservationAfter"),
            price_multiplier=v.number(v.get(spec, "priceMultiplier", 1), "spec.priceMultiplier", minimum=0),
            burst_allowed=v.boolean(v.get(burst, "allowed", False), "spec.burst.allowed"),
            burst_after_s=v.optional(v.duration, burst.get("after"), "spec.burst.after"),
        )


@dataclass(frozen=True)
class SimulatedSpec:
    """An in-process simulated agent for this cluster (`sluice up`, tests): nodes identical nodes."""

    nodes: int
    node: dict[str, int]  # allocatable per node, milli-units


@dataclass(frozen=True)
class ClusterObject(_Kind, kind="Cluster",
                    spec_fields=("tier", "site", "leaseDuration", "price", "prometheus", "elastic", "podPolicy",
                                 "kubernetes", "simulated")):
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    tier: str = "onprem"  # onprem | cloud | edge
    site: str = ""
    lease_duration_s: float = None  # type: ignore[assignment]  # seconds; None: default_lease_duration_s(tier)
    price: dict[str, float] = field(default_factory=dict)  # per unit-hour (memory: per GiB-hour)
    prometheus: dict | None = None  # {"url": str, "selector"?: str}
    # {"maxNodes": int, "provisioningDelay": seconds, "scaleDownAfter": seconds, "node": milli-units or None}
    elastic: dict | None = None
    # allow* booleans, and "serviceAccounts": the service account names pod templates may use
    # (() : only the namespace's default)
    pod_policy: dict = field(default_factory=lambda: {**dict.fromkeys(POD_POLICY_FIELDS, False),
                                                      "serviceAccounts": ()})
    # For the kubernetes agent: "namespaces" {queue: namespace} (a queue not named maps to its own name),
    # "createNamespaces" bool, "gangStartTimeout" seconds, "workload" pods | jobs, "intake" {namespace:
    # {"user": name, "queues": (queue, ...)}}: the namespaces whose Jobs labelled sluice.io/queue the agent
    # submits to Sluice (docs/user-guide.md, "Submitting with kubectl"), as whom and to which queues;
    # "adminObjects" bool: the management cluster, whose agent syncs the sluice.io custom resources.
    kubernetes: dict = field(default_factory=lambda: {"namespaces": {}, "createNamespaces": False,
                                                      "gangStartTimeout": DEFAULT_GANG_START_TIMEOUT_S,
                                                      "workload": "pods", "intake": {}, "adminObjects": False})
    simulated: SimulatedSpec | None = None

    def __post_init__(self) -> None:
        if self.lease_duration_s is None:
            object.__setattr__(self, "lease_duration_s", default_lease_duration_s(self.tier))

    def to_document(self) -> dict:
        spec: dict = {"tier": self.tier, "site": self.site,
                      "leaseDuration": format_duration_exact(self.lease_duration_s), "price": dict(self.price)}
        if self.prometheus is not None:
            spec["prometheus"] = dict(self.prometheus)
            if "timeout" in self.prometheus:  # a duration, written as every other is
                spec["prometheus"]["timeout"] = format_duration_exact(self.prometheus["timeout"])
        if self.elastic is not None:
            spec["elastic"] = {"maxNodes": self.elastic["maxNodes"],
                               "provisioningDelay": format_duration_exact(self.elastic["provisioningDelay"]),
                               "scaleDownAfter": format_duration_exact(self.elastic["scaleDownAfter"])}
            if self.elastic.get("node"):
                spec["elastic"]["node"] = format_resources(self.elastic["node"])
        spec["podPolicy"] = {**self.pod_policy, "serviceAccounts": list(self.pod_policy["serviceAccounts"])}
        spec["kubernetes"] = {**self.kubernetes, "namespaces": dict(self.kubernetes["namespaces"]),
                              "gangStartTimeout": format_duration_exact(self.kubernetes["gangStartTimeout"])}
        if self.kubernetes.get("intake"):
            spec["kubernetes"]["intake"] = {ns: {"user": m["user"], "queues": list(m["queues"])}
                                            for ns, m in self.kubernetes["intake"].items()}
        else:
            spec["kubernetes"].pop("intake", None)
        if not self.kubernetes.get("adminObjects"):
            spec["kubernetes"].pop("adminObjects", None)
        if self.simulated is not None:
            spec["simulated"] = {"nodes": self.simulated.nodes, "node": format_resources(self.simulated.node)}
        return _document(self.kind, self.name, spec, self.labels)

    @classmethod
    def from_spec(cls, name: str, metadata: dict, spec: dict) -> ClusterObject:
        tier = v.choice(v.get(spec, "tier", "onprem"), "spec.tier", TIERS)
        price = {}
        for resource, amount in v.mapping(spec.get("price"), "spec.price").items():
            price[v.string(resource, "spec.price")] = v.number(amount, f"spec.price.{resource}", minimum=0)
        pod_policy = v.mapping(spec.get("podPolicy"), "spec.podPolicy", allowed=POD_POLICY_SPEC_FIELDS)
        elastic = v.optional(_elastic, spec.get("elastic"), "spec.elastic")
        simulated = v.optional(_simulated, spec.get("simulated"), "spec.simulated")
        if simulated is not None and elastic is None and simulated.nodes == 0:
            raise SpecError("spec.simulated.nodes", "must be at least 1 unless the cluster is elastic")
        if elastic is not None:
            if simulated is not None and elastic["maxNodes"] < simulated.nodes:
                raise SpecError("spec.elastic.maxNodes", f"must be at least spec.simulated.nodes ({simulated.nodes})")
            if not elastic["node"] and simulated is not None:
                elastic["node"] = dict(simulated.node)  # without a node shape no headroom is counted
        return cls(
            name=name,
            labels=v.labels(metadata.get("labels"), "metadata.labels"),
            tier=tier,
            site=v.string(v.get(spec, "site", ""), "spec.site", max_len=MAX_SITE_LENGTH, allow_empty=True),
            lease_duration_s=v.duration(v.get(spec, "leaseDuration", default_lease_duration_s(tier)),
                                        "spec.leaseDuration", positive=True),
            price=price,
            prometheus=v.optional(_prometheus, spec.get("prometheus"), "spec.prometheus"),
            elastic=elastic,
            pod_policy={**{key: v.boolean(v.get(pod_policy, key, False), f"spec.podPolicy.{key}")
                           for key in POD_POLICY_FIELDS},
                        "serviceAccounts": v.unique_names(pod_policy.get("serviceAccounts"),
                                                          "spec.podPolicy.serviceAccounts")},
            kubernetes=_kubernetes(spec.get("kubernetes"), "spec.kubernetes"),
            simulated=simulated,
        )


PROMETHEUS_QUERIES = ("allocatable", "unschedulable", "not_ready", "requests", "pods", "sample_time",
                      "scraped_time")


def _prometheus(value: object, path: str) -> dict:
    """url, and optionally: selector (label matchers), timeout (seconds per query), retries, headers (sent
    with every query, e.g. Authorization), queries (PromQL templates by name, `{sel}` for the matchers)."""
    prometheus = v.mapping(value, path, allowed=PROMETHEUS_FIELDS)
    url = v.string(v.required(prometheus, "url", path), f"{path}.url")
    if not url.startswith(("http://", "https://")):
        raise SpecError(f"{path}.url", f"must be an http:// or https:// URL, got {url!r}")
    out: dict = {"url": url}
    if prometheus.get("selector") is not None:
        out["selector"] = v.string(prometheus["selector"], f"{path}.selector")
    if prometheus.get("timeout") is not None:
        out["timeout"] = v.duration(prometheus["timeout"], f"{path}.timeout", positive=True)
    if prometheus.get("retries") is not None:
        out["retries"] = v.integer(prometheus["retries"], f"{path}.retries", 0, MAX_PROMETHEUS_RETRIES)
    if prometheus.get("headers") is not None:
        headers = v.mapping(prometheus["headers"], f"{path}.headers")
        out["headers"] = {str(k): v.string(h, f"{path}.headers.{k}") for k, h in headers.items()}
    if prometheus.get("queries") is not None:
        queries = v.mapping(prometheus["queries"], f"{path}.queries", allowed=PROMETHEUS_QUERIES)
        out["queries"] = {k: v.string(q, f"{path}.queries.{k}") for k, q in queries.items()}
    return out


def _elastic(value: object, path: str) -> dict:
    elastic = v.mapping(value, path, allowed=ELASTIC_FIELDS)
    return {"maxNodes": v.integer(v.required(elastic, "maxNodes", path), f"{path}.maxNodes", 1, MAX_NODES),
            "provisioningDelay": v.duration(v.get(elastic, "provisioningDelay", 0), f"{path}.provisioningDelay"),
            "scaleDownAfter": v.duration(v.get(elastic, "scaleDownAfter", 600), f"{path}.scaleDownAfter"),
            "node": v.resources(elastic.get("node"), f"{path}.node")}


def _namespace(value: object, path: str) -> str:
    text = v.string(value, path)
    if not NAMESPACE.fullmatch(text):
        raise SpecError(path, f"{text!r} is not a Kubernetes namespace name (lowercase letters, digits and '-', "
                        "at most 63)")
    return text


def _kubernetes(value: object, path: str) -> dict:
    k8s = v.mapping(value, path, allowed=KUBERNETES_FIELDS)
    namespaces = v.mapping(k8s.get("namespaces"), f"{path}.namespaces")
    return {"namespaces": {v.name(q, f"{path}.namespaces"): _namespace(ns, f"{path}.namespaces.{q}")
                           for q, ns in namespaces.items()},
            "createNamespaces": v.boolean(v.get(k8s, "createNamespaces", False), f"{path}.createNamespaces"),
            "gangStartTimeout": v.duration(v.get(k8s, "gangStartTimeout", DEFAULT_GANG_START_TIMEOUT_S),
                                           f"{path}.gangStartTimeout", positive=True),
            "workload": v.choice(v.get(k8s, "workload", "pods"), f"{path}.workload", WORKLOADS),
            "intake": {_namespace(ns, f"{path}.intake"): _intake(entry, f"{path}.intake.{ns}")
                       for ns, entry in v.mapping(k8s.get("intake"), f"{path}.intake").items()},
            "adminObjects": v.boolean(v.get(k8s, "adminObjects", False), f"{path}.adminObjects")}


def _intake(value: object, path: str) -> dict:
    """One intake namespace: the Sluice user its Jobs are submitted as, and the queues they may name (at
    least one; a Job's sluice.io/queue label must be one of them)."""
    entry = v.mapping(value, path, allowed=INTAKE_FIELDS, required=True)
    queues = v.unique_names(v.required(entry, "queues", path), f"{path}.queues")
    if not queues:
        raise SpecError(f"{path}.queues", "must name at least one queue")
    user = v.string(v.required(entry, "user", path), f"{path}.user", max_len=253)  # a token's or OIDC subject
    return {"user": user, "queues": tuple(queues)}


def _simulated(value: object, path: str) -> SimulatedSpec:
    simulated = v.mapping(value, path, allowed=SIMULATED_FIELDS)
    nodes = v.integer(v.required(simulated, "nodes", path), f"{path}.nodes", 0, MAX_NODES)
    node = v.resources(v.required(simulated, "node", path), f"{path}.node")
    if not node:
        raise SpecError(f"{path}.node", "must name at least one resource")
    return SimulatedSpec(nodes=nodes, node=node)


@dataclass(frozen=True)
class BurstPolicyObject(_Kind, kind="BurstPolicy",
                        spec_fields=("queues", "serviceClasses", "clusterSelector", "after", "budget",
                                     "maxResources", "perQueue")):
    name: str
    queues: tuple[str, ...] = ()  # () means all
    service_classes: tuple[str, ...] = ()  # () means all
    cluster_selector: dict[str, str] = field(default_factory=dict)  # the paid clusters it may use
    after_s: float = 0.0  # seconds waited at least (a class may require longer)
    budget_per_hour: float | None = None  # money; None: no limit
    budget_per_day: float | None = None
    max_resources: dict[str, int] = field(default_factory=dict)  # concurrent, milli-units
    # The same limits for each queue on its own, within the policy's: perHour, perDay, maxResources.
    queue_budget_per_hour: float | None = None
    queue_budget_per_day: float | None = None
    queue_max_resources: dict[str, int] = field(default_factory=dict)

    def to_document(self) -> dict:
        per_queue = {"budget": _budget(self.queue_budget_per_hour, self.queue_budget_per_day),
                     "maxResources": format_resources(self.queue_max_resources)}
        return _document(self.kind, self.name, {
            "queues": list(self.queues), "serviceClasses": list(self.service_classes),
            "clusterSelector": dict(self.cluster_selector), "after": format_duration_exact(self.after_s),
            "budget": _budget(self.budget_per_hour, self.budget_per_day),
            "maxResources": format_resources(self.max_resources), "perQueue": per_queue})

    @classmethod
    def from_spec(cls, name: str, metadata: dict, spec: dict) -> BurstPolicyObject:
        budget = v.mapping(spec.get("budget"), "spec.budget", allowed=BUDGET_FIELDS)
        per_queue = v.mapping(spec.get("perQueue"), "spec.perQueue", allowed=PER_QUEUE_FIELDS)
        queue_budget = v.mapping(per_queue.get("budget"), "spec.perQueue.budget", allowed=BUDGET_FIELDS)
        return cls(
            name=name,
            queues=v.unique_names(spec.get("queues"), "spec.queues"),
            service_classes=v.unique_names(spec.get("serviceClasses"), "spec.serviceClasses"),
            cluster_selector=v.labels(spec.get("clusterSelector"), "spec.clusterSelector"),
            after_s=v.duration(v.get(spec, "after", 0), "spec.after"),
            budget_per_hour=v.optional(v.number, budget.get("perHour"), "spec.budget.perHour", minimum=0),
            budget_per_day=v.optional(v.number, budget.get("perDay"), "spec.budget.perDay", minimum=0),
            max_resources=v.resources(spec.get("maxResources"), "spec.maxResources"),
            queue_budget_per_hour=v.optional(v.number, queue_budget.get("perHour"), "spec.perQueue.budget.perHour",
                                             minimum=0),
            queue_budget_per_day=v.optional(v.number, queue_budget.get("perDay"), "spec.perQueue.budget.perDay",
                                            minimum=0),
            queue_max_resources=v.resources(per_queue.get("maxResources"), "spec.perQueue.maxResources"),
        )


def _budget(per_hour: float | None, per_day: float | None) -> dict:
    out = {}
    if per_hour is not None:
        out["perHour"] = per_hour
    if per_day is not None:
        out["perDay"] = per_day
    return out


AdminObject = QueueObject | ServiceClassObject | ClusterObject | BurstPolicyObject
KINDS: dict[str, type] = {cls.kind: cls for cls in (QueueObject, ServiceClassObject, ClusterObject,
                                                    BurstPolicyObject)}
# What people type for a kind on the command line, lowercased and without '-' or '_'.
_KIND_WORDS = {"queue": "Queue", "queues": "Queue", "serviceclass": "ServiceClass", "serviceclasses": "ServiceClass",
               "class": "ServiceClass", "classes": "ServiceClass", "cluster": "Cluster", "clusters": "Cluster",
               "burstpolicy": "BurstPolicy", "burstpolicies": "BurstPolicy"}


def kind_named(text: str) -> str | None:
    """The kind a user means by `text` ('queues', 'class', 'Burst-Policy', ...), or None."""
    return _KIND_WORDS.get(text.lower().replace("-", "").replace("_", ""))


def object_from_document(doc: dict, *, document: int | None = None, source: str | None = None) -> AdminObject:
    """Validate one admin object document."""
    with v.located(document, source):
        doc = v.mapping(doc, "")
        if doc.get("apiVersion") != API_VERSION:
            raise SpecError("apiVersion", f"must be {API_VERSION}, got {v.describe(doc.get('apiVersion'))}")
        kind = doc.get("kind")
        cls = KINDS.get(kind) if isinstance(kind, str) else None
        if cls is None:
            hint = " (jobs are submitted with `sluice submit`)" if kind == "Job" else ""
            raise SpecError("kind", f"unknown kind {v.describe(kind)}, known: {', '.join(sorted(KINDS))}{hint}")
        v.check_fields(doc, ("apiVersion", "kind", "metadata", "spec"), "")
        metadata = v.mapping(doc.get("metadata"), "metadata", required=True,
                             allowed=("name", "labels") if cls is ClusterObject else ("name",))
        name = v.name(v.required(metadata, "name", "metadata"), "metadata.name")
        spec = v.mapping(doc.get("spec"), "spec", allowed=cls.spec_fields)
        return cls.from_spec(name, metadata, spec)


def load_objects(text: str, *, source: str = "<input>") -> list[AdminObject]:
    """Every admin object in a file; an error names the file and the 1-based document."""
    return [object_from_document(doc, document=number, source=source)
            for number, doc in parse_numbered_documents(text, source=source)]


def default_objects() -> list[AdminObject]:
    """What `sluice up` runs without a config (examples/cluster-config.yaml spells out the same).

    Standard jobs spill to the priced cloud cluster after waiting 10 minutes (or at once when no
    on-prem start is expected within that), within the cloud-burst policy's budgets; batch never."""
    return [
        ServiceClassObject("critical", priority=1000, can_preempt=True),
        ServiceClassObject("standard", priority=500, burst_allowed=True, burst_after_s=600.0),
        ServiceClassObject("batch", priority=100, preemptible=True),
        QueueObject("default", service_classes=("standard", "critical", "batch")),
        ClusterObject("onprem", tier="onprem", site="dc-1", simulated=SimulatedSpec(
            4, parse_resources({"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"}))),
        ClusterObject("cloud", tier="cloud", site="cloud-1",
                      price={"cpu": 0.04, "memory": 0.005, "nvidia.com/gpu": 2.5},
                      simulated=SimulatedSpec(4, parse_resources({"cpu": "16", "memory": "64Gi"}))),
        ClusterObject("edge", tier="edge", site="edge-1", lease_duration_s=4 * 3600.0,
                      simulated=SimulatedSpec(2, parse_resources({"cpu": "8", "memory": "32Gi"}))),
        BurstPolicyObject("cloud-burst", cluster_selector={"tier": "cloud"}, budget_per_hour=25.0,
                          budget_per_day=200.0),
    ]
