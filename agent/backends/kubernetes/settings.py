"""The kubernetes backend's per-cluster settings, taken from the Cluster object the dispatcher sends.

The agent process's own options (kubeconfig, timeouts, backoff) are `KubernetesSettings` in backend.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sluice.objects import DEFAULT_GANG_START_TIMEOUT_S, object_from_document

WORKLOAD_PODS = "pods"
WORKLOAD_JOBS = "jobs"


@dataclass(frozen=True)
class ClusterSettings:
    """What the kubernetes agent reads from its Cluster object (metadata.name, spec.kubernetes, spec.podPolicy)."""

    name: str = ""  # this cluster's; "": not told yet (no Welcome), so no job's origin is this cluster
    namespaces: dict[str, str] = field(default_factory=dict)  # queue -> namespace; others: the queue's name
    create_namespaces: bool = False
    gang_start_timeout_s: float = DEFAULT_GANG_START_TIMEOUT_S  # seconds
    workload: str = WORKLOAD_PODS  # pods | jobs
    allow_privileged: bool = False
    allow_host_path: bool = False
    allow_host_network: bool = False
    allow_host_pid: bool = False
    service_accounts: tuple[str, ...] = ()  # besides `default`
    intake_namespaces: frozenset[str] = frozenset()  # whose Jobs labelled sluice.io/queue go to the dispatcher
    admin_objects: bool = False  # the management cluster: its sluice.io resources go to the dispatcher

    @classmethod
    def from_document(cls, document: dict) -> ClusterSettings:
        """From the Cluster object document (validated again here; SpecError when invalid)."""
        obj = object_from_document(document)
        if getattr(obj, "kind", None) != "Cluster":
            raise ValueError(f"expected a Cluster document, got {document.get('kind')!r}")
        k8s, policy = obj.kubernetes, obj.pod_policy  # type: ignore[union-attr]
        return cls(name=obj.name, namespaces=dict(k8s["namespaces"]), create_namespaces=bool(k8s["createNamespaces"]),
                   gang_start_timeout_s=float(k8s["gangStartTimeout"]), workload=k8s["workload"],
                   allow_privileged=bool(policy["allowPrivileged"]), allow_host_path=bool(policy["allowHostPath"]),
                   allow_host_network=bool(policy["allowHostNetwork"]), allow_host_pid=bool(policy["allowHostPID"]),
                   service_accounts=tuple(policy["serviceAccounts"]), intake_namespaces=frozenset(k8s["intake"]),
                   admin_objects=bool(k8s["adminObjects"]))

    def namespace_for(self, queue: str) -> str:
        return self.namespaces.get(queue, queue)
