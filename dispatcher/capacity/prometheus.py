"""Reading each cluster's capacity from Prometheus (kube-state-metrics series), off the scheduling path.

The only module that speaks PromQL. Per cluster, from one Prometheus URL and a label selector (one
Prometheus per cluster, or a shared one such as Thanos/Mimir with `{cluster="onprem-a"}`):
- allocatable per schedulable node (nodes cordoned or not Ready are left out),
- requests of every non-terminated (Pending or Running) pod, per node (Pending pods on no node count
  against the cluster total only),
- so: allocatable, free = allocatable - requests, and the largest free amount on one node, per
  resource (`resource="nvidia_com_gpu"` is `nvidia.com/gpu`), and
- the (job, attempt) pairs whose pods the series show (`kube_pod_labels`): the dispatcher counts the
  requests of active attempts not among them itself, so each attempt is counted exactly once.
A refresher thread per cluster writes the latest reading to Postgres at a set interval; the scheduler
only reads what is stored (dispatcher/capacity/snapshot.py).
"""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dispatcher import wakes
from dispatcher.errors import StoreUnavailable
from dispatcher.store import channels
from dispatcher.store import clusters as cluster_store
from dispatcher.store.database import Sessions
from sluice.quantity import add, parse_duration, subtract

log = logging.getLogger(__name__)

# PromQL per reading; {sel} is the cluster's label matchers (never empty). Overridable per cluster.
QUERIES = {
    "allocatable": 'kube_node_status_allocatable{{{sel}}}',
    "unschedulable": 'kube_node_spec_unschedulable{{{sel}}} == 1',
    "not_ready": 'kube_node_status_condition{{{sel}, condition="Ready", status="true"}} == 0',
    "requests": ('kube_pod_container_resource_requests{{{sel}}} * on(namespace, pod) group_left() '
                 '(max by (namespace, pod) (kube_pod_status_phase{{{sel}, phase=~"Pending|Running"}}) == 1)'),
    "pods": 'kube_pod_labels{{{sel}, label_sluice_io_job_id!=""}}',
    "sample_time": 'max(timestamp(kube_node_status_allocatable{{{sel}}}))',
    # Without any allocatable series (a cluster of no nodes: an elastic one at zero): the latest scrape of
    # its kube-state-metrics that succeeded, which then reads as zero capacity.
    "scraped_time": 'max(timestamp(up{{{sel}}} == 1))',
}


class PrometheusError(Exception):
    """Prometheus could not be read (unreachable, timed out, bad query); the reading is skipped."""


def _seconds(value: object) -> float:
    """A stored duration: the canonical string ('5s', '2.5s') ClusterObject.to_document() writes, or a number
    of seconds (the form it wrote for the timeout before, still in older stored clusters)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return parse_duration(value)


@dataclass(frozen=True)
class PrometheusSettings:
    """A cluster's `spec.prometheus` section."""

    url: str
    selector: str = ""  # label matchers such as '{cluster="onprem-a"}'; empty: every series at url
    timeout_s: float = 5.0  # per query
    retries: int = 1  # per query, on connection errors and 5xx
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Authorization for a secured Prometheus
    queries: dict[str, str] = field(default_factory=dict)  # overrides of QUERIES by name

    @staticmethod
    def from_document(doc: dict) -> PrometheusSettings:
        return PrometheusSettings(
            url=doc["url"], selector=doc.get("selector", ""), timeout_s=_seconds(doc.get("timeout", 5.0)),
            retries=int(doc.get("retries", 1)), headers=dict(doc.get("headers", {})),
            queries=dict(doc.get("queries", {})))

    def query(self, name: str) -> str:
        matchers = self.selector.strip().strip("{}").strip() or '__name__!=""'
        return self.queries.get(name, QUERIES[name]).format(sel=matchers)


@dataclass(frozen=True)
class Reading:
    allocatable: dict[str, int]
    free: dict[str, int]
    largest_free_node: dict[str, int]
    attempts: frozenset[tuple[int, int]]  # (job, attempt) whose pods the series show
    sampled_at: datetime

    def document(self) -> dict:
        return {"allocatable": self.allocatable, "free": self.free, "largestFreeNode": self.largest_free_node,
                "attempts": sorted([j, a] for j, a in self.attempts)}


def resource_name(ksm: str) -> str:
    """kube-state-metrics' resource label back to the Kubernetes name (nvidia_com_gpu -> nvidia.com/gpu)."""
    if ksm in ("cpu", "memory", "pods"):
        return ksm
    if ksm == "ephemeral_storage":
        return "ephemeral-storage"
    match = re.fullmatch(r"([a-z0-9]+)_(com|io|org|net|dev)_(.+)", ksm)
    return f"{match.group(1)}.{match.group(2)}/{match.group(3)}" if match else ksm


def _milli(value: str) -> int:
    return int(round(float(value) * 1000))


def compute(allocatable: list[dict], unschedulable: list[dict], not_ready: list[dict], requests: list[dict],
            pods: list[dict], sampled_at: datetime) -> Reading:
    """A reading from the raw query results (each a Prometheus vector: [{"metric": {...}, "value": [t, v]}])."""
    excluded = {s["metric"].get("node") for s in unschedulable + not_ready}
    nodes: dict[str, dict[str, int]] = {}
    for s in allocatable:
        node = s["metric"].get("node", "")
        if node and node not in excluded:
            nodes.setdefault(node, {})[resource_name(s["metric"].get("resource", ""))] = _milli(s["value"][1])
    used: dict[str, dict[str, int]] = {}
    for s in requests:
        node = s["metric"].get("node", "")
        if node in excluded:
            continue  # its pods hold what the excluded node has, which is not counted either
        key = node if node in nodes else ""
        used[key] = add(used.get(key, {}), {resource_name(s["metric"].get("resource", "")): _milli(s["value"][1])})
    total: dict[str, int] = {}
    for amounts in nodes.values():
        total = add(total, amounts)
    free = dict(total)
    for amounts in used.values():
        free = subtract(free, amounts)
    largest: dict[str, int] = {}
    for node, amounts in nodes.items():
        for resource, left in subtract(amounts, used.get(node, {})).items():
            largest[resource] = max(largest.get(resource, left), left)
    seen = set()
    for s in pods:
        try:
            seen.add((int(s["metric"]["label_sluice_io_job_id"]), int(s["metric"]["label_sluice_io_attempt"])))
        except (KeyError, ValueError):
            continue
    return Reading(total, free, largest, frozenset(seen), sampled_at)


def read(settings: PrometheusSettings) -> Reading:
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    client = PrometheusConnect(settings.url, headers=settings.headers or None, timeout=settings.timeout_s,
                               retry=Retry(total=settings.retries, backoff_factor=0.1,
                                           status_forcelist=[500, 502, 503, 504]))
    try:
        stamps = client.custom_query(settings.query("sample_time"))
        if not stamps:
            scraped = client.custom_query(settings.query("scraped_time"))
            if not scraped:
                raise PrometheusError(f"{settings.url}: no kube_node_status_allocatable series for "
                                      f"{settings.selector or 'it'}, nor a kube-state-metrics scrape that is up")
            return compute([], [], [], [], [], datetime.fromtimestamp(float(scraped[0]["value"][1]), UTC))
        # Every other query is evaluated at the time of that latest sample, so all of them read one
        # and the same scrape: evaluated at "now" one by one, a scrape landing between two queries
        # would show an attempt's pods in `pods` but not yet in `requests`, counting it zero times.
        at = stamps[0]["value"][1]
        results = {name: client.custom_query(settings.query(name), params={"time": at})
                   for name in QUERIES if name not in ("sample_time", "scraped_time")}
    except PrometheusError:
        raise
    except Exception as exc:  # requests' and the client's own errors alike: this reading fails
        raise PrometheusError(f"{settings.url}: {exc}") from exc
    if not results["allocatable"]:
        raise PrometheusError(f"{settings.url}: no kube_node_status_allocatable series for {settings.selector or 'it'}")
    return compute(sampled_at=datetime.fromtimestamp(float(at), UTC), **results)


class Refresher:
    """One thread per cluster with a `prometheus` section: read, store, sleep `interval_s`; repeat.

    The set of clusters is looked at again every `rescan_s`, so clusters applied later are picked up.
    """

    def __init__(self, sessions: Sessions, *, interval_s: float = 1.0, rescan_s: float = 2.0):
        self._sessions = sessions
        self._interval_s = interval_s
        self._rescan_s = rescan_s
        self._stop = threading.Event()
        self._threads: dict[str, tuple[PrometheusSettings, threading.Thread, threading.Event]] = {}
        self._thread = threading.Thread(target=self._run, name="prometheus-refresher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for _, _thread, stop in self._threads.values():
            stop.set()
        self._thread.join(5)
        for _, thread, _ in self._threads.values():
            thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._sessions() as session:
                    wanted = {c.name: PrometheusSettings.from_document(c.spec["spec"]["prometheus"])
                              for c in cluster_store.list_clusters(session)
                              if (c.spec.get("spec") or {}).get("prometheus")}
                for name in list(self._threads):
                    if wanted.get(name) != self._threads[name][0]:
                        self._threads.pop(name)[2].set()
                for name, settings in wanted.items():
                    if name not in self._threads:
                        stop = threading.Event()
                        thread = threading.Thread(target=self._refresh, args=(name, settings, stop),
                                                  name=f"prometheus-{name}", daemon=True)
                        self._threads[name] = (settings, thread, stop)
                        thread.start()
            except StoreUnavailable:
                pass  # the leader stops leading, and this refresher, once it finds the store gone
            except Exception:
                log.exception("prometheus refresher could not list clusters")
            self._stop.wait(self._rescan_s)

    def _refresh(self, cluster: str, settings: PrometheusSettings, stop: threading.Event) -> None:
        last: dict | None = None
        failing = ""  # the last failure said, so a long outage is logged once, not every second
        while not stop.is_set() and not self._stop.is_set():
            try:
                reading = read(settings)
                document = reading.document()
                with self._sessions.begin() as session:
                    cluster_store.record_prometheus(session, cluster, document, reading.sampled_at)
                    if document != last:
                        channels.notify(session, channels.WAKE_CHANNEL, wakes.ROOM)
                last = document
                if failing:
                    log.warning("prometheus reading of %s works again", cluster, extra={"cluster": cluster})
                failing = ""
            except PrometheusError as exc:
                if str(exc) != failing:
                    log.warning("prometheus reading of %s failed (its agent's report is used meanwhile): %s",
                                cluster, exc, extra={"cluster": cluster})
                failing = str(exc)
            except StoreUnavailable:
                pass  # the leader stops leading, and this refresher, once it finds the store gone
            except Exception:
                log.exception("prometheus refresher failed", extra={"cluster": cluster})
            stop.wait(self._interval_s)
