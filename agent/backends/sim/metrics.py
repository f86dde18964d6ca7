"""kube-state-metrics series for one simulated cluster, served over HTTP on loopback.

So the PromQL that reads capacity from production clusters runs unchanged against `sluice up`'s
simulated ones: a real Prometheus scrapes `SimMetricsServer.url`. Every series is a gauge named and
labelled as kube-state-metrics v2 does; namespace is always "sluice":

    kube_node_status_allocatable{node, resource, unit}       per node and resource
    kube_node_spec_unschedulable{node}                       1 when cordoned, else 0
    kube_node_status_condition{node, condition="Ready", status="true"|"false"|"unknown"}
                                                             1 for the current status, 0 for the others
    kube_pod_info{namespace, pod, node}                      1; node "" while Pending (unbound)
    kube_pod_status_phase{namespace, pod, phase}             one per phase of Pending, Running,
                                                             Succeeded, Failed, Unknown; 1 for the current
    kube_pod_container_resource_requests{namespace, pod, container="main", node, resource, unit}
                                                             the pod's effective requests (pod_requests),
                                                             finished pods included, as in kube-state-metrics
    kube_pod_labels{namespace, pod, label_sluice_io_job_id, label_sluice_io_attempt}   1

Resources: `resource` is the Kubernetes name with every character outside [a-zA-Z0-9_] replaced by
"_" (nvidia.com/gpu -> nvidia_com_gpu, ephemeral-storage -> ephemeral_storage). `unit` is "core"
for cpu (value in cores, 0.5 for 500m), "byte" for memory, storage, ephemeral-storage and hugepages-*
(value in bytes), "integer" for everything else. Values are the sim's milli-units / 1000, unrounded,
so they agree exactly with SimCluster.capacity():

    usable node          kube_node_spec_unschedulable == 0 and Ready status="true" == 1
    counted pod          phase Pending or Running, and bound to a usable node or to none (node "")
    allocatable[r]       sum of kube_node_status_allocatable over usable nodes
    free[r]              allocatable[r] - sum of the requests of counted pods
    largest_free_node[r] max over usable nodes n of (allocatable of n - requests of counted pods on n)

Every pod the sim holds is listed: Pending, Running, and the finished pods of attempts that are not
final yet (an attempt's pods are removed when it ends). A scrape reads one consistent SimCluster.view().

Elastic clusters: a node appears in the series only once it has joined (Ready); nodes still being
provisioned have no series, and a node the autoscaler removed loses its series at once. No Running
pod is ever bound to a removed node, so the agreement above holds. One difference remains: with no
node at all the series carry no node shape, so a reader sees none of the shape's resources where
capacity() lists them as 0 (non-zero amounts, such as the free taken by Pending pods, agree).
"""
from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from agent.backends.sim.cluster import SimCluster
from agent.backends.sim.views import SimView
from sluice.serving import MetricsServer

NAMESPACE = "sluice"
CONTAINER = "main"
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
READY_STATUSES = ("true", "false", "unknown")
_BYTE_RESOURCES = frozenset({"memory", "storage", "ephemeral-storage"})
_INVALID_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def resource_label(name: str) -> str:
    """The `resource` label kube-state-metrics gives a Kubernetes resource name."""
    return _INVALID_LABEL_CHAR.sub("_", name)


def resource_unit(name: str) -> str:
    """The `unit` label kube-state-metrics gives a Kubernetes resource name."""
    if name == "cpu":
        return "core"
    if name in _BYTE_RESOURCES or name.startswith("hugepages-"):
        return "byte"
    return "integer"


def metric_value(milli: int) -> float:
    """A milli-unit amount in the series' unit: cores, bytes or a count."""
    return milli / 1000


def families(view: SimView) -> list[Metric]:
    """The kube-state-metrics families of one view of a simulated cluster (pure)."""
    allocatable = GaugeMetricFamily(
        "kube_node_status_allocatable",
        "The allocatable for different resources of a node that are available for scheduling.",
        labels=["node", "resource", "unit"])
    unschedulable = GaugeMetricFamily(
        "kube_node_spec_unschedulable", "Whether a node can schedule new pods.", labels=["node"])
    condition = GaugeMetricFamily(
        "kube_node_status_condition", "The condition of a cluster node.",
        labels=["node", "condition", "status"])
    for node in view.nodes:
        for name, amount in sorted(node.allocatable.items()):
            allocatable.add_metric([node.name, resource_label(name), resource_unit(name)], metric_value(amount))
        unschedulable.add_metric([node.name], 0 if node.schedulable else 1)
        status = "true" if node.ready else "false"
        for candidate in READY_STATUSES:
            condition.add_metric([node.name, "Ready", candidate], 1 if candidate == status else 0)

    info = GaugeMetricFamily("kube_pod_info", "Information about pod.", labels=["namespace", "pod", "node"])
    phase = GaugeMetricFamily(
        "kube_pod_status_phase", "The pods current phase.", labels=["namespace", "pod", "phase"])
    requests = GaugeMetricFamily(
        "kube_pod_container_resource_requests", "The number of requested request resource by a container.",
        labels=["namespace", "pod", "container", "node", "resource", "unit"])
    pod_labels = GaugeMetricFamily(
        "kube_pod_labels", "Kubernetes labels converted to Prometheus labels.",
        labels=["namespace", "pod", "label_sluice_io_job_id", "label_sluice_io_attempt"])
    for pod in view.pods:
        node = pod.node or ""
        info.add_metric([NAMESPACE, pod.name, node], 1)
        for candidate in POD_PHASES:
            phase.add_metric([NAMESPACE, pod.name, candidate], 1 if candidate == pod.phase else 0)
        for name, amount in sorted(pod.request.items()):
            requests.add_metric(
                [NAMESPACE, pod.name, CONTAINER, node, resource_label(name), resource_unit(name)],
                metric_value(amount))
        pod_labels.add_metric([NAMESPACE, pod.name, str(pod.job_id), str(pod.attempt)], 1)
    return [allocatable, unschedulable, condition, info, phase, requests, pod_labels]


class _SimCollector:
    """Reads the cluster at every scrape. No describe(): the names are fixed, the registry is private."""

    def __init__(self, sim: SimCluster) -> None:
        self._sim = sim

    def collect(self) -> Iterator[Metric]:
        yield from families(self._sim.view())


def registry_for(sim: SimCluster) -> CollectorRegistry:
    """A private registry holding only this cluster's kube-state-metrics series."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SimCollector(sim))
    return registry


class SimMetricsServer:
    """Serves one SimCluster's kube-state-metrics series over HTTP; loopback by default."""

    def __init__(self, sim: SimCluster, host: str = "127.0.0.1", port: int = 0) -> None:
        self._registry = registry_for(sim)
        self._host = host
        self._port = port
        self._server: MetricsServer | None = None

    def start(self) -> int:
        """Start serving (port 0 picks a free one); returns the bound port."""
        if self._server is not None:
            raise RuntimeError("SimMetricsServer.start called twice")
        self._server = MetricsServer(f"{self._host}:{self._port}", self._registry)
        self._port = self._server.port
        return self._port

    def stop(self) -> None:
        """Stop serving; a server that is not running is left alone."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    @property
    def port(self) -> int:
        """The bound port once started (before that, the one asked for)."""
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}/metrics"
