"""Kubernetes CustomResourceDefinitions for the admin kinds: Queue, ServiceClass, Cluster and BurstPolicy.

crd(kind) is the apiextensions.k8s.io/v1 CustomResourceDefinition of one kind: group sluice.io, version v1
(served and stored), cluster-scoped (admin objects are global in Sluice: one namespace-less object per name),
a structural openAPIV3Schema, the status subresource and the columns `kubectl get` prints. It is what
`sluice admin crds` prints, and what deploy/base/crds and the Helm chart (crds.enabled) ship, written there by
deploy/sync_crds.py (docs/admin-guide.md, "Admin objects as Kubernetes resources").

The schema is built from the models in sluice.objects, not beside them: every mapping's fields are the
parser's own (a kind's `spec_fields`, and the field tuples the parser checks nested mappings against: a
field described here that the parser does not know, or one it knows that is not described here, is a
SchemaDrift when the CRDs are built), and its enums, bounds and patterns are the parser's constants.
tests/unit/test_crds.py holds the two to each other: what to_document() writes passes the schema, and the
schema refuses what the parser refuses and nothing else, except for the rules in RULES_NOT_IN_SCHEMA and
STRICTER_THAN_SLUICE. The sync from the management cluster validates every object as `sluice admin apply`
does, so the rules a schema cannot hold are still enforced: their errors appear in the object's status rather
than at `kubectl apply`.
"""
from __future__ import annotations

import json

import yaml

from sluice import objects as o
from sluice._validate import NAME
from sluice.quantity import _DURATION, _QUANTITY, MAX_MILLI, format_resources  # the parsers' own patterns
from sluice.spec import API_VERSION, MAX_PRIORITY, MIN_PRIORITY, TIERS

__all__ = ["GROUP", "VERSION", "NAMES", "RULES_NOT_IN_SCHEMA", "STRICTER_THAN_SLUICE", "SchemaDrift", "crd",
           "crds", "admin_document", "resource_summary", "manifests_yaml", "manifests_json"]

GROUP, VERSION = API_VERSION.split("/")
CATEGORY = "sluice"  # `kubectl get sluice` lists the objects of all four kinds
LABELS = {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/part-of": "sluice"}
# kind: (plural, singular, short names). No short name is one a built-in resource uses (sc is StorageClass's).
NAMES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "Queue": ("queues", "queue", ("sq",)),
    "ServiceClass": ("serviceclasses", "serviceclass", ("ssc",)),
    "Cluster": ("clusters", "cluster", ("scl",)),
    "BurstPolicy": ("burstpolicies", "burstpolicy", ("sbp",)),
}

# What the parser checks that a structural schema cannot say (tests/unit/test_crds.py finds no other
# difference; docs/admin-guide.md lists the same). The sync reports these in the object's status.
RULES_NOT_IN_SCHEMA = (
    "rules between fields: a queue's spec.parent is not its own name; each spec.guaranteed amount is at most "
    "spec.max's for the same resource; spec.usageHalfLife only on a queue without spec.parent; a cluster's "
    "spec.simulated.nodes is at least 1 unless it has spec.elastic, and spec.elastic.maxNodes at least "
    "spec.simulated.nodes",
    "rules between objects, checked against the stored ones: parents, classes and queues named exist, queues "
    "form no cycle, a child's guaranteed fits in its parent's",
    "the keys of maps: resource names (spec.guaranteed, spec.max, spec.price, ...) are not empty, the queue "
    "names in spec.kubernetes.namespaces are Sluice names, and spec.clusterSelector's keys are label keys",
    "magnitudes a pattern cannot bound: a quantity written as a string is at most 2^62 milli-units, a "
    "duration written as a string is finite",
    "null: Kubernetes drops a field or map entry set to null before validating; the parser takes a null field "
    "as absent too, but refuses null as a map's value (spec.guaranteed, spec.price, ...) and in "
    "spec.prometheus.queries",
)
# And what Kubernetes refuses that `sluice admin apply` takes (the same tests find no other difference).
STRICTER_THAN_SLUICE = (
    "a quantity or duration written as a number must be a whole number: write 1.5 as \"1.5\", 2.5 seconds as "
    "\"2.5s\"",
    "quantities and durations are written without spaces around them",
    "object names have no '_': Kubernetes names are DNS subdomains",
    "a Cluster's metadata.labels are Kubernetes labels: values too are at most 63 letters, digits, '-', '_' or "
    "'.', starting and ending with a letter or digit",
)


class SchemaDrift(Exception):
    """The schema here and the parser in sluice.objects describe different fields: a bug, found by the tests."""


# -- building blocks -------------------------------------------------------------------------------

def _name(description: str) -> dict:
    """A Sluice object name (sluice._validate.name)."""
    return {"description": description, "type": "string", "maxLength": 63, "pattern": NAME.pattern}


def _names(description: str) -> dict:
    """A list of names, each once (unique_names): a set, whose duplicates Kubernetes refuses."""
    return {"description": description, "type": "array", "items": {"type": "string", "maxLength": 63,
                                                                   "pattern": NAME.pattern},
            "x-kubernetes-list-type": "set"}


def _quantity(description: str) -> dict:
    """A Kubernetes quantity (sluice.quantity.parse_quantity) as a string or an integer, at most 2^62 milli-units."""
    return {"description": description, "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": _QUANTITY.pattern,
            "minimum": 0, "maximum": MAX_MILLI // 1000}


def _resources(description: str) -> dict:
    return {"description": description, "type": "object",
            "additionalProperties": _quantity("A quantity: '500m', '2', '32Gi', or an integer.")}


# A duration longer than 0 (sluice._validate.duration(positive=True)): _DURATION's number with a digit
# other than 0 in it (tests/unit/test_crds.py compares the two with the parser on generated strings).
_POSITIVE_DURATION = r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]*\.[0-9]*[1-9][0-9]*)(ms|s|m|h|d)$"


def _duration(description: str, positive: bool = False) -> dict:
    """A duration (sluice.quantity.parse_duration): '90s', '10m', '2h', '1d', '250ms', or whole seconds."""
    schema = {"description": description, "x-kubernetes-int-or-string": True,
              "anyOf": [{"type": "integer"}, {"type": "string"}],
              "pattern": _POSITIVE_DURATION if positive else _DURATION.pattern, "minimum": 0}
    if positive:
        schema["exclusiveMinimum"] = True
    return schema


def _number(description: str, *, minimum: float = 0, exclusive: bool = False) -> dict:
    schema = {"description": description, "type": "number", "minimum": minimum}
    if exclusive:
        schema["exclusiveMinimum"] = True
    return schema


def _boolean(description: str) -> dict:
    return {"description": description, "type": "boolean"}


def _string(description: str, **bounds) -> dict:
    return {"description": description, "type": "string", **bounds}


def _object(where: str, fields: tuple[str, ...], description: str, properties: dict[str, dict],
            required: tuple[str, ...] = ()) -> dict:
    """A mapping whose fields are exactly the parser's `fields`, in the parser's order."""
    if set(properties) != set(fields):
        unknown = sorted(set(properties) - set(fields))
        missing = sorted(set(fields) - set(properties))
        raise SchemaDrift(f"{where}: " + "; ".join(
            part for part in (f"described here but unknown to the parser: {', '.join(unknown)}" if unknown else "",
                              f"known to the parser but not described here: {', '.join(missing)}" if missing else "")
            if part))
    schema = {"description": description, "type": "object", "properties": {f: properties[f] for f in fields}}
    if required:
        schema["required"] = list(required)
    return schema


# -- the kinds' specs ------------------------------------------------------------------------------

def _queue_spec() -> dict:
    return _object("Queue spec", o.QueueObject.spec_fields, "What the queue is: its place in the tree, quotas and "
                   "members.", {
                       "parent": _name("The parent queue; none for a top-level queue. Not the queue itself."),
                       "guaranteed": _resources(
                           "What the queue can always get back, per resource; each at most spec.max's. A resource "
                           "not named is not guaranteed."),
                       "max": _resources("A hard cap per resource; a resource not named is unlimited."),
                       "weight": _number("Fair-share weight among its siblings (default 1).", exclusive=True),
                       "members": {"description": "Users who may submit to it; none listed: every user.",
                                   "type": "array", "items": {"type": "string", "minLength": 1}},
                       "serviceClasses": _names("Accepted service classes, the first the default; none: all."),
                       "usageHalfLife": _duration(
                           "Only on a top-level queue: fair share remembers its tree's usage with this half-life.",
                           positive=True),
                   })


def _service_class_spec() -> dict:
    return _object("ServiceClass spec", o.ServiceClassObject.spec_fields, "How its jobs are ordered, preempted, "
                   "reserved for, priced and burst.", {
                       "priority": {"description": f"{MIN_PRIORITY} to {MAX_PRIORITY}; higher classes go first "
                                                   "(default 0).",
                                    "type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY},
                       "preemptible": _boolean("Its jobs may be evicted to make room (default false)."),
                       "canPreempt": _boolean("Its jobs may evict preemptible jobs of lower classes (default false)."),
                       "weight": _number("Multiplies the queue's fair-share weight (default 1).", exclusive=True),
                       "reservationAfter": _duration("A job waiting this long that fits nowhere reserves capacity; "
                                                     "none: never."),
                       "priceMultiplier": _number("Multiplies cluster prices in chargeback and burst cost "
                                                  "(default 1)."),
                       "burst": _object("ServiceClass spec.burst", o.BURST_FIELDS, "Spilling to paid clusters.", {
                           "allowed": _boolean("Its jobs may run on paid clusters, under a burst policy."),
                           "after": _duration("The least a job waits before bursting (a policy may ask more)."),
                       }),
                   })


def _cluster_spec() -> dict:
    resources = "An extended resource's name (nvidia.com/gpu), cpu or memory"
    return _object("Cluster spec", o.ClusterObject.spec_fields, "A cluster jobs run on: its tier, site, lease, "
                   "prices, capacity source and what its agent does.", {
                       "tier": _string("onprem, cloud (paid: jobs go there only under a burst policy) or edge "
                                       "(default onprem).", enum=list(TIERS)),
                       "site": _string("What spec.placement.sites of jobs matches.", maxLength=o.MAX_SITE_LENGTH),
                       "leaseDuration": _duration("Unreachable this long, its running jobs are lost and requeued "
                                                  "(default 5m; 4h for tier edge).", positive=True),
                       "price": {"description": f"Price per unit-hour (memory: per GiB-hour), at least 0. {resources} "
                                                "to a number; a resource without a price costs nothing.",
                                 "type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
                       "prometheus": _object("Cluster spec.prometheus", o.PROMETHEUS_FIELDS,
                                             "Read capacity from this Prometheus instead of the agent's reports.", {
                           "url": _string("http:// or https:// URL.", pattern="^https?://"),
                           "selector": _string("Label matchers added to every query, e.g. {cluster=\"onprem-a\"}.",
                                               minLength=1),
                           "timeout": _duration("Per query (default 5s).", positive=True),
                           "retries": {"description": "Per query, on connection errors and 5xx answers (default 1).",
                                       "type": "integer", "minimum": 0, "maximum": o.MAX_PROMETHEUS_RETRIES},
                           "headers": {"description": "Sent with every query (e.g. Authorization).", "type": "object",
                                       "additionalProperties": {"type": "string", "minLength": 1}},
                           "queries": _object("Cluster spec.prometheus.queries", o.PROMETHEUS_QUERIES,
                                              "PromQL templates by name replacing the built-in ones; {sel} stands "
                                              "for the selector.",
                                              {name: _string(f"The {name} query.", minLength=1)
                                               for name in o.PROMETHEUS_QUERIES}),
                       }, required=("url",)),
                       "elastic": _object("Cluster spec.elastic", o.ELASTIC_FIELDS, "An autoscaled cluster.", {
                           "maxNodes": {"description": "At most this many nodes; at least spec.simulated.nodes.",
                                        "type": "integer", "minimum": 1, "maximum": o.MAX_NODES},
                           "provisioningDelay": _duration("How long a new node takes (default 0)."),
                           "scaleDownAfter": _duration("How long an idle node stays (default 600 seconds)."),
                           "node": _resources("A new node's allocatable; without it no headroom is counted."),
                       }, required=("maxNodes",)),
                       "podPolicy": _object("Cluster spec.podPolicy", o.POD_POLICY_SPEC_FIELDS,
                                            "What pod templates may ask for on this cluster (all false by default).", {
                           "allowPrivileged": _boolean("Privileged containers."),
                           "allowHostPath": _boolean("hostPath volumes."),
                           "allowHostNetwork": _boolean("hostNetwork: true."),
                           "allowHostPID": _boolean("hostPID or hostIPC: true."),
                           "serviceAccounts": _names("Service accounts templates may use besides the namespace's "
                                                     "default."),
                       }),
                       "kubernetes": _object("Cluster spec.kubernetes", o.KUBERNETES_FIELDS,
                                             "Settings of the kubernetes agent backend.", {
                           "namespaces": {"description": "Queue name to the namespace its jobs run in; a queue not "
                                                         "named runs in the namespace of its own name.",
                                          "type": "object", "additionalProperties": {
                                              "type": "string", "pattern": f"^(?:{o.NAMESPACE.pattern})$"}},
                           "createNamespaces": _boolean("Create a missing namespace (default false)."),
                           "gangStartTimeout": _duration("An attempt whose pods are not all running within this is "
                                                         "requeued (default 300 seconds).", positive=True),
                           "workload": _string("What the agent creates per pod set: pods, or one Indexed batch/v1 "
                                               "Job (default pods).", enum=list(o.WORKLOADS)),
                           "intake": {"description": "The kubectl front door: namespace to the Sluice user its "
                                                     "suspended Jobs labelled sluice.io/queue are submitted as, and "
                                                     "the queues they may name.",
                                      "type": "object", "additionalProperties": _object(
                                          "Cluster spec.kubernetes.intake.*", o.INTAKE_FIELDS, "One namespace.", {
                                              "user": _string("The Sluice user its Jobs are submitted as.",
                                                              minLength=1, maxLength=253),
                                              "queues": {**_names("The queues its Jobs may name (at least one)."),
                                                         "minItems": 1},
                                          }, required=("user", "queues"))},
                           "adminObjects": _boolean("The management cluster: its agent syncs the sluice.io "
                                                    "custom resources to the dispatcher (default false)."),
                       }),
                       "simulated": _object("Cluster spec.simulated", o.SIMULATED_FIELDS,
                                            "For sluice up and tests: an in-process simulated agent.", {
                           "nodes": {"description": "Identical nodes; at least 1 unless the cluster is elastic.",
                                     "type": "integer", "minimum": 0, "maximum": o.MAX_NODES},
                           "node": {**_resources("Each node's allocatable; at least one resource."),
                                    "minProperties": 1},
                       }, required=("nodes", "node")),
                   })


def _budget(where: str) -> dict:
    return _object(where, o.BUDGET_FIELDS, "Money limits; none: no limit.", {
        "perHour": _number("The cost rate of its running bursts, at least 0."),
        "perDay": _number("Spent in the UTC day, at least 0."),
    })


def _burst_policy_spec() -> dict:
    return _object("BurstPolicy spec", o.BurstPolicyObject.spec_fields, "Which jobs may spill to which paid "
                   "clusters, when, and within what limits.", {
                       "queues": _names("The queues it applies to; none: every queue."),
                       "serviceClasses": _names("The classes it applies to; none: every class (which must allow "
                                                "bursting too)."),
                       "clusterSelector": {"description": "The paid clusters it may use, by their metadata.labels.",
                                           "type": "object",
                                           "additionalProperties": {"type": "string", "maxLength": 63}},
                       "after": _duration("The least a job waits first (default 0; a class may ask more)."),
                       "budget": _budget("BurstPolicy spec.budget"),
                       "maxResources": _resources("Concurrent requests across its bursts."),
                       "perQueue": _object("BurstPolicy spec.perQueue", o.PER_QUEUE_FIELDS,
                                           "The same limits for each queue on its own, within the policy's.", {
                           "budget": _budget("BurstPolicy spec.perQueue.budget"),
                           "maxResources": _resources("Concurrent requests of one queue's bursts."),
                       }),
                   })


_SPECS = {"Queue": _queue_spec, "ServiceClass": _service_class_spec, "Cluster": _cluster_spec,
          "BurstPolicy": _burst_policy_spec}

# -- status and columns ----------------------------------------------------------------------------

# metav1.Condition, as Kubernetes' own types declare it.
CONDITION = {
    "description": "One aspect of the object's state (type Accepted: the outcome of the last sync).",
    "type": "object",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {"type": "string", "maxLength": 316,
                 "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                   "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
        "message": {"type": "string", "maxLength": 32768},
    },
}

def _status(kind: str) -> dict:
    properties = {
        "accepted": _boolean("Whether the dispatcher took the object as it is at observedGeneration (false: "
                             "validation refused it, all or nothing as `sluice admin apply`; message says why)."),
        "message": _string("Why it was refused, as `sluice admin apply` says it; empty when accepted."),
        "observedGeneration": {"description": "The metadata.generation the sync last acted on.", "type": "integer",
                               "format": "int64", "minimum": 0},
        "conditions": {"description": "Standard conditions.", "type": "array", "items": CONDITION,
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    }
    if kind == "Queue":
        properties["guaranteed"] = _string("spec.guaranteed in one line (cpu=64,memory=256Gi; - for none).")
        properties["max"] = _string("spec.max in one line (- for none: unlimited).")
        properties["used"] = _string("What the queue's running jobs use, in one line, when the sync last looked.")
    return {"description": "Written by the management cluster's agent: the outcome of syncing the object to the "
                           "dispatcher.", "type": "object", "properties": properties}


def _column(name: str, json_path: str, kind: str, description: str, priority: int = 0) -> dict:
    column = {"name": name, "type": kind, "jsonPath": json_path, "description": description}
    if priority:
        column["priority"] = priority
    return column


_ACCEPTED = _column("Accepted", ".status.accepted", "boolean", "Whether the dispatcher took it as it is.")
_MESSAGE = _column("Message", ".status.message", "string", "Why it was refused.", priority=1)
_AGE = _column("Age", ".metadata.creationTimestamp", "date", "Since it was created.")
COLUMNS: dict[str, list[dict]] = {
    "Queue": [_column("Parent", ".spec.parent", "string", "The parent queue."),
              _column("Weight", ".spec.weight", "number", "Fair-share weight (<none>: the default, 1)."),
              _column("Guaranteed", ".status.guaranteed", "string", "spec.guaranteed in one line."),
              _column("Max", ".status.max", "string", "spec.max in one line."),
              _column("Used", ".status.used", "string", "What its running jobs use."),
              _ACCEPTED, _MESSAGE, _AGE],
    "ServiceClass": [_column("Priority", ".spec.priority", "integer", "Higher goes first."),
                     _column("Preemptible", ".spec.preemptible", "boolean", "May be evicted."),
                     _column("CanPreempt", ".spec.canPreempt", "boolean", "May evict."),
                     _column("Burst", ".spec.burst.allowed", "boolean", "May run on paid clusters."),
                     _ACCEPTED, _MESSAGE, _AGE],
    "Cluster": [_column("Tier", ".spec.tier", "string", "onprem, cloud or edge."),
                _column("Site", ".spec.site", "string", "Its site."),
                _column("Lease", ".spec.leaseDuration", "string", "How long it may be unreachable."),
                _ACCEPTED, _MESSAGE, _AGE],
    "BurstPolicy": [_column("After", ".spec.after", "string", "The least a job waits first."),
                    _column("PerHour", ".spec.budget.perHour", "number", "Budget per hour."),
                    _column("PerDay", ".spec.budget.perDay", "number", "Budget per UTC day."),
                    _ACCEPTED, _MESSAGE, _AGE],
}


def admin_document(resource: dict) -> dict:
    """The Sluice document a custom resource stands for, as the sync hands it to the same validation as
    `sluice admin apply`: apiVersion, kind, metadata.name (with metadata.labels for a Cluster, the one kind that
    has labels in Sluice; on other kinds they are Kubernetes' alone) and spec. Status, and the rest of the
    metadata Kubernetes keeps, are not part of the object."""
    metadata = resource.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    doc: dict = {"apiVersion": resource.get("apiVersion"), "kind": resource.get("kind"),
                 "metadata": {"name": metadata.get("name")}}
    if resource.get("kind") == "Cluster" and metadata.get("labels"):
        doc["metadata"]["labels"] = metadata["labels"]
    if "spec" in resource:
        doc["spec"] = resource["spec"]
    return doc


def resource_summary(milli: dict[str, int]) -> str:
    """A resource map (milli-units) as a Queue's status shows it: 'cpu=64,memory=256Gi', '-' for none."""
    return ",".join(f"{name}={amount}" for name, amount in format_resources(milli).items()) or "-"


# -- the definitions -------------------------------------------------------------------------------

def _root(kind: str) -> dict:
    return {
        "description": f"A Sluice {kind} (docs/api.md, \"Admin objects\"), synced to the dispatcher by the management "
                       "cluster's agent with the same validation as `sluice admin apply`.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # A CRD may restrict only the name in metadata; Kubernetes itself wants a DNS subdomain (no '_').
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 63,
                                                                   "pattern": NAME.pattern}}},
            "spec": _SPECS[kind](),
            "status": _status(kind),
        },
    }


def crd(kind: str) -> dict:
    """The CustomResourceDefinition of one admin kind ('Queue', 'ServiceClass', 'Cluster', 'BurstPolicy')."""
    if kind not in o.KINDS:
        raise ValueError(f"unknown kind {kind!r}, known: {', '.join(sorted(o.KINDS))}")
    plural, singular, short_names = NAMES[kind]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": dict(LABELS)},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular,
                      "shortNames": list(short_names), "categories": [CATEGORY]},
            "scope": "Cluster",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": _root(kind)},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [dict(c) for c in COLUMNS[kind]],
            }],
        },
    }


def crds() -> list[dict]:
    """The four CustomResourceDefinitions, in sluice.objects.KINDS' order."""
    return [crd(kind) for kind in o.KINDS]


def manifests_yaml(documents: list[dict]) -> str:
    """YAML documents separated by ---, for `kubectl apply -f`."""
    return yaml.safe_dump_all(documents, sort_keys=False, width=120, default_flow_style=False)


def manifests_json(documents: list[dict]) -> str:
    """One v1 List of the documents, for `kubectl apply -f`."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}, indent=2) + "\n"
