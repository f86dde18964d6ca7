"""A cluster's usable capacity as the scheduler reads it (ClusterCapacity), and what its Cluster object adds
to it (terms). No store here: `snapshot` builds these from Postgres, the replay from its simulated clusters
(simulation/world.py), so both hand the policy the same thing."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from dispatcher.policy.placing import ClusterState
from sluice.objects import ClusterObject, object_from_document

DEFAULT_STALENESS_S = 10.0  # a Prometheus reading older than this is not trusted


@dataclass(frozen=True)
class ClusterCapacity:
    state: ClusterState
    status: str  # active | cordoned | draining | unreachable
    source: str  # prometheus | agent | none
    age_seconds: float  # of the reading in use; -1 when there is none
    allocatable: dict[str, int]


def cluster_object(document: dict | str) -> ClusterObject:
    """The Cluster object of a stored document, or of its JSON text (as the cycle reads it: CLUSTER_ROWS).
    Each distinct text is parsed once, not every cycle, and its object shared: callers never change it."""
    return _parsed(document) if isinstance(document, str) else object_from_document(document)


# Parsed documents kept: more than there are clusters, or a cycle over them all would evict each before its reuse.
KEPT_DOCUMENTS = 16384


@functools.lru_cache(maxsize=KEPT_DOCUMENTS)
def _parsed(text: str) -> ClusterObject:
    return object_from_document(json.loads(text))


def terms(document: dict | str, allocatable: dict[str, int]) -> dict:
    """What a cluster's object adds to its ClusterState: paid (tier cloud), prices and, when elastic with a
    known node shape, its headroom (maxNodes x node shape less what it has now), node shape and delay.
    `document`: the object's document, or its JSON text (see cluster_object)."""
    obj = cluster_object(document)
    out = {"paid": obj.tier == "cloud", "price": dict(obj.price)}
    if obj.elastic and obj.elastic.get("node"):
        node = dict(obj.elastic["node"])
        out.update(headroom={r: max(0, amount * obj.elastic["maxNodes"] - allocatable.get(r, 0))
                             for r, amount in node.items()},
                   node_shape=node, provisioning_delay_s=obj.elastic["provisioningDelay"])
    return out
