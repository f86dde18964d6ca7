"""The agent's backend for a real Kubernetes cluster (`sluice agent run --backend kubernetes`).

Per attempt it creates the objects of every pod set (Pods, or one batch/v1 Job per pod set: the
cluster's `spec.kubernetes.workload`, see docs/adr/0003-pods-or-jobs.md) in the namespace the job's
queue maps to, watches them and reports the attempt's state; the rules are in status.py, the
manifests in objects.py, the Cluster object's settings in settings.py, the pod policy in policy.py,
the API calls in api.py.

Guarantees:
- Stateless: the cluster is the source of truth. Every object carries `sluice.io/job-id`,
  `sluice.io/attempt`, `sluice.io/pod-set` and `app.kubernetes.io/managed-by: sluice`; `inventory()`
  lists them afresh (the agent calls it on start and on every reconnect), and a restarted agent picks
  up every attempt where it stands, including its gang clock (`sluice.io/created-at`).
- Idempotent creation: names are deterministic and AlreadyExists (409) counts as success, so a
  repeated dispatch, or one re-sent after the agent died half-way through creating, never makes a
  second object. Within one process an attempt is never created again once created or deleted.
- Status changes reach `on_status` in order, from one delivery thread, never under the lock. Each
  attempt reports each state once per process, and nothing after its final state or after Sluice
  started deleting it (cancel, preempt, orphan); RUNNING is reported again when its first pod's
  address (status.py `pod_address`) becomes known or changes.
- Watches keep their resourceVersion across reconnects, relist on 410 Gone, and back off
  exponentially (honouring Retry-After) on 429, 5xx and lost connections. A watch that cannot be
  reopened leaves the last known state in place; nothing is reported lost because of it.
- Refusals create nothing: a pod template the cluster's podPolicy forbids, an unmappable namespace, a
  namespace that does not exist when `createNamespaces` is off, and an object the API server rejects
  (422, 403) are reported FAILED with the reason, and whatever part was created is deleted.
- Deletes use foreground propagation, so a Job's pods are gone before the Job is.
- Adoption (the kubectl front door): an attempt of a job submitted as a suspended Job through this
  cluster's API server (`spec.origin.cluster` is this cluster's name) runs as that very Job when it can
  (objects.py `adoption`: the same uid, still suspended, never started, never adopted, the job's count of
  pods): one merge patch, conditional on the Job's resourceVersion, puts the attempt's labels and
  annotations on the Job and its pod template, and the nodes the dispatch names to keep off in its node
  affinity, and unsuspends it; from then on it is tracked, evaluated
  and listed as any Job of workload `jobs`. Otherwise a copy is made as for any job. The Job is the
  user's: Sluice never deletes it. Where an attempt's objects would be deleted (cancel, preempt, orphan,
  FAILED, LOST, UNSCHEDULABLE), an adopted Job that has not finished is suspended again and no longer
  labelled managed-by Sluice (objects.py `release_patch`); a finished one, and retention, leave it as it is.

Cluster settings (namespaces, createNamespaces, gangStartTimeout, workload, podPolicy) come from the
Cluster object through `configure()`, which the agent calls with the document the dispatcher sends
in its Welcome; until then the defaults apply.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent.backends.base import (
    FAILED,
    FINAL_STATES,
    LOST,
    PENDING,
    RUNNING,
    UNSCHEDULABLE,
    AttemptStatus,
    CapacityReport,
    StatusCallback,
)
from agent.backends.kubernetes import status as ks
from agent.backends.kubernetes.admin_objects import AdminObjects
from agent.backends.kubernetes.api import CUSTOM_RESOURCES, ApiSettings, Backoff, KubeApi, KubeError
from agent.backends.kubernetes.intake import INTAKE_SELECTOR, JobIntake
from agent.backends.kubernetes.logs import PodLogs, select_pods
from agent.backends.kubernetes.objects import (
    ADOPT,
    ADOPTED,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    MANAGED_SELECTOR,
    AttemptPlan,
    Refused,
    adopted,
    adoption,
    adoption_mark,
    adoption_patch,
    attempt_key,
    attempt_selector,
    event_manifest,
    origin_of,
    plan_attempt,
    release_patch,
)
from agent.backends.kubernetes.settings import ClusterSettings

log = logging.getLogger(__name__)

# What the backend watches, as (what it feeds, the kind listed, its label selector): all pods (the capacity
# report needs every pod's requests; Sluice's own are picked out by label), Sluice's Jobs, the nodes, and the
# Jobs users label for Sluice (intake.py).
WATCHED = (("pods", "pods", None), ("jobs", "jobs", MANAGED_SELECTOR), ("nodes", "nodes", None),
           ("intake", "jobs", INTAKE_SELECTOR))


@dataclass(frozen=True)
class KubernetesSettings:
    kubeconfig: str | None = None  # path; None: in-cluster config inside a pod, else the default kubeconfig
    context: str | None = None  # kubeconfig context; None: its current-context
    final_retention_s: float = 600.0  # a final attempt's objects are deleted this long after it ended
    image_pull_grace_s: float = 60.0  # ErrImagePull/ImagePullBackOff (and CreateContainer*Error) this long: FAILED
    tick_s: float = 0.5  # how often the time-based rules (gang timeout, pull grace, retention) are applied
    watch_timeout_s: int = 300  # the API server ends a watch after this; it is reopened from its resourceVersion
    request_timeout_s: float = 30.0  # per API call
    backoff_initial_s: float = 0.2  # first delay after a failed call or watch, doubled up to backoff_max_s
    backoff_max_s: float = 30.0
    call_attempts: int = 5  # tries of one create or delete on 429/5xx before the command is given up (re-sent)
    sync_timeout_s: float = 30.0  # start() waits this long for the first list of pods, jobs and nodes
    log_poll_s: float = 1.0  # following logs, how often a pod whose container has not started is looked at again


@dataclass
class _Track:
    """What this process knows about one attempt beyond its objects."""

    status: AttemptStatus | None = None  # the last state reported
    reported_at: float = 0.0  # when this process reported it, by its clock (its retention runs from here)
    cleanup: str = ks.CLEANUP_NONE  # what its final verdict deletes
    complete: bool = False  # every pod of its gang existed at once: a pod missing now was deleted
    deleting: bool = False  # Sluice deletes its objects: report nothing more from them
    seen: bool = False  # its objects were observed
    since: float = field(default_factory=time.monotonic)

    @property
    def final(self) -> bool:
        return self.status is not None and self.status.state in FINAL_STATES


_EVENT_REASONS = {UNSCHEDULABLE: "SluiceGangStartTimeout", FAILED: "SluiceAttemptFailed", LOST: "SluiceAttemptLost"}


def _owned_by_job(pod: dict) -> bool:
    return any(ref.get("kind") == "Job" for ref in (pod.get("metadata") or {}).get("ownerReferences") or [])


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubernetesBackend:
    def __init__(self, settings: KubernetesSettings = KubernetesSettings(), *,
                 cluster: ClusterSettings | None = None, clock: Callable[[], float] = time.time):
        self.settings = settings
        self._clock = clock
        self._api = KubeApi(ApiSettings(settings.kubeconfig, settings.context, settings.request_timeout_s))
        self._cluster = cluster or ClusterSettings()
        self._lock = threading.Condition()
        self._pods: dict[tuple[str, str], dict] = {}  # Sluice's pods
        self._usage: dict[tuple[str, str], ks.PodUsage] = {}  # every pod, for capacity
        self._jobs: dict[tuple[str, str], dict] = {}
        self._nodes: dict[str, dict] = {}
        self._index: dict[tuple[int, int], set[tuple[str, str, str]]] = collections.defaultdict(set)
        self._tracks: dict[tuple[int, int], _Track] = {}
        self._known: set[tuple[int, int]] = set()  # created or deleted by this process: never created again
        self._verdicts: dict[tuple[int, int], tuple[AttemptStatus, float]] = {}  # final, decided by the agent
        self._waiting_since: dict[str, float] = {}
        self._dirty: set[tuple[int, int]] = set()
        self._namespaces_ready: set[str] = set()
        self._synced = {name: threading.Event() for name, _, _ in WATCHED}
        self.intake = JobIntake(self._api)
        self.admin_objects = AdminObjects(self._api)
        self._feeds = {name: (self.intake.replace, self.intake.observe) if name == "intake" else
                       (functools.partial(self._replace, plural), functools.partial(self._apply, plural))
                       for name, plural, _ in WATCHED}
        self._outbox: queue.Queue = queue.Queue()
        self._on_status: StatusCallback | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.stats: collections.Counter = collections.Counter()  # lists, watches, backoffs per kind

    # -- Backend protocol ------------------------------------------------------------------------
    def configure(self, cluster_document: dict) -> None:
        """Take the cluster's settings from its Cluster object document (sent in the dispatcher's Welcome)."""
        cluster = ClusterSettings.from_document(cluster_document)
        with self._lock:
            changed = cluster != self._cluster
            self._cluster = cluster
            self._dirty.update(self._index)
            self._lock.notify_all()
        self.intake.configure(cluster.intake_namespaces)
        if cluster.admin_objects:
            self._watch_admin_objects()
        if changed:
            log.info("kubernetes backend configured", extra={"workload": cluster.workload,
                                                             "gang_start_timeout_s": cluster.gang_start_timeout_s})

    @property
    def cluster(self) -> ClusterSettings:
        return self._cluster

    def start(self, on_status: StatusCallback) -> None:
        self._on_status = on_status
        targets = [(self._deliver, "kube-deliver"), (self._reconcile_loop, "kube-reconcile")]
        targets += [(lambda n=name, p=plural, s=selector: self._watch_loop(n, p, s), f"kube-watch-{name}")
                    for name, plural, selector in WATCHED]
        for target, name in targets:
            self._start_thread(target, name)
        deadline = time.monotonic() + self.settings.sync_timeout_s
        for plural, event in self._synced.items():
            if not event.wait(max(deadline - time.monotonic(), 0.0)):
                log.warning("kubernetes: no initial list yet; carrying on, the watch keeps trying",
                            extra={"kind": plural, "host": self._api.host})

    def _start_thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _watch_admin_objects(self) -> None:
        """Watch the sluice.io resources, once this cluster is the management cluster (their CRDs exist there
        only: elsewhere the watch would fail for ever)."""
        with self._lock:
            if CUSTOM_RESOURCES[0] in self._feeds:
                return
            for plural in CUSTOM_RESOURCES:
                self._feeds[plural] = (functools.partial(self.admin_objects.replace, plural),
                                       functools.partial(self.admin_objects.observe, plural))
                self._synced[plural] = threading.Event()
        for plural in CUSTOM_RESOURCES:
            self._start_thread(lambda p=plural: self._watch_loop(p, p, None), f"kube-watch-{plural}")

    def stop(self) -> None:
        self._stop.set()
        self._api.interrupt()
        with self._lock:
            self._lock.notify_all()
        self._outbox.put(None)
        for thread in self._threads:
            thread.join(5)
        self._api.close()

    def create_attempt(self, job_id: int, attempt: int, spec: dict, avoid_nodes: tuple[str, ...] = ()) -> bool:
        key = (int(job_id), int(attempt))
        with self._lock:
            if key in self._known:
                return False
            cluster = self._cluster
        origin = origin_of(spec)
        if origin is not None and cluster.name and origin["cluster"] == cluster.name:
            taken = self._adopt(key, spec, origin, cluster, tuple(avoid_nodes))
            if taken is not None:
                return taken
        plan = self._plan(key, spec, cluster, tuple(avoid_nodes))
        if plan is None:
            return True
        try:
            self._ensure_namespace(plan.namespace, cluster)
        except Refused as exc:
            self._decide(key, FAILED, str(exc))
            return True
        created = 0
        for manifest in plan.manifests:
            plural = "jobs" if manifest["kind"] == "Job" else "pods"
            try:
                self._retrying(lambda p=plural, m=manifest: self._api.create(p, plan.namespace, m))
                created += 1
            except KubeError as exc:
                if exc.status == 409:
                    continue  # created before (a repeated command, or a previous agent process)
                if exc.transient:
                    raise  # not acked: the command comes again and creation resumes where it stopped
                if exc.status == 404 and not cluster.create_namespaces:
                    reason = (f"namespace {plan.namespace} does not exist, and this cluster does not create "
                              "namespaces (spec.kubernetes.createNamespaces)")
                else:
                    reason = f"Kubernetes refused {manifest['kind']} {manifest['metadata']['name']}: {exc.message}"
                self._decide(key, FAILED, reason)
                self._delete_listed(key)
                return True
        with self._lock:
            self._known.add(key)
        log.info("kubernetes: attempt created", extra={"job_id": key[0], "attempt": key[1], "objects": created,
                                                       "namespace": plan.namespace})
        return created > 0

    def _plan(self, key: tuple[int, int], document: dict, cluster: ClusterSettings,
              avoid_nodes: tuple[str, ...] = ()) -> AttemptPlan | None:
        """The attempt's objects; None once it is reported FAILED: refused (Refused says why), or a document
        this agent could not make objects of, which fails its job, not the command each time it comes again."""
        try:
            return plan_attempt(key[0], key[1], document, cluster, _rfc3339(self._clock()), avoid_nodes)
        except Refused as exc:
            self._decide(key, FAILED, str(exc))
        except Exception as exc:  # a defect met by one job's document: that job fails, the agent goes on
            log.exception("kubernetes: could not make an attempt's objects", extra={"job_id": key[0],
                                                                                  "attempt": key[1]})
            self._decide(key, FAILED, f"the agent could not make the attempt's objects from its job document "
                                      f"({type(exc).__name__}: {exc})")
        return None

    def _adopt(self, key: tuple[int, int], document: dict, origin: dict[str, str],
               cluster: ClusterSettings, avoid_nodes: tuple[str, ...] = ()) -> bool | None:
        """Run the attempt as the suspended Job its job was submitted as in this cluster: True when adopted now
        (or refused by the pod policy: reported FAILED), False when this attempt adopted it before (a repeated
        command, or one to a restarted agent), None when the Job cannot run it (the caller makes a copy)."""
        namespace, name = origin["namespace"], origin["name"]
        # Its pods run in the Job's own namespace: the pod policy is checked against that one.
        queue = str((document.get("spec") or {}).get("queue") or "")
        in_place = dataclasses.replace(cluster, namespaces={**cluster.namespaces, queue: namespace})
        for _ in range(self.settings.call_attempts):
            try:
                job = self._retrying(lambda: self._api.read_job(namespace, name))
            except KubeError as exc:
                if exc.transient:
                    raise  # not acked: the command comes again
                log.warning("kubernetes: cannot read the job's own Job; creating a copy", extra={
                    "job_id": key[0], "attempt": key[1], "namespace": namespace, "name": name, "error": str(exc)})
                return None
            verdict, why = adoption(job, document, *key)
            if verdict == ADOPTED:
                with self._lock:
                    self._known.add(key)
                return False
            if verdict != ADOPT:
                log.info("kubernetes: the job's own Job cannot run it; creating a copy", extra={
                    "job_id": key[0], "attempt": key[1], "namespace": namespace, "name": name, "why": why})
                return None
            plan = self._plan(key, document, in_place)
            if plan is None:
                return True
            labels, annotations = plan.marks[0]
            patch = adoption_patch(job, labels, annotations, adoption_mark(*key), avoid_nodes)
            try:
                self._retrying(lambda body=patch: self._api.patch("jobs", namespace, name, body))
            except KubeError as exc:
                if exc.status == 409:
                    continue  # the Job changed since it was read (its owner, the intake's mirroring): look again
                if exc.transient:
                    raise  # not acked: the command comes again
                log.warning("kubernetes: the API server refused adopting the job's own Job; creating a copy",
                            extra={"job_id": key[0], "attempt": key[1], "namespace": namespace, "name": name,
                                   "error": str(exc)})
                return None
            with self._lock:
                self._known.add(key)
            log.info("kubernetes: attempt adopted the Job it was submitted as", extra={
                "job_id": key[0], "attempt": key[1], "namespace": namespace, "name": name})
            return True
        raise KubeError(409, "Conflict", f"Job {namespace}/{name} kept changing while it was being adopted")

    def delete_attempt(self, job_id: int, attempt: int) -> None:
        key = (int(job_id), int(attempt))
        with self._lock:
            self._known.add(key)
            self._tracks.setdefault(key, _Track()).deleting = True
        self._delete_listed(key)

    def inventory(self) -> list[AttemptStatus]:
        """Every attempt with labelled objects in the cluster, from a fresh list, plus the final outcomes this
        process decided itself (refusals, gang timeouts) for as long as they are retained."""
        pods, _ = self._retrying(lambda: self._api.list("pods", label_selector=MANAGED_SELECTOR))
        jobs, _ = self._retrying(lambda: self._api.list("jobs", label_selector=MANAGED_SELECTOR))
        groups: dict[tuple[int, int], tuple[list, list]] = collections.defaultdict(lambda: ([], []))
        for obj in pods:
            if (key := attempt_key(obj)) is not None:
                groups[key][0].append(obj)
        for obj in jobs:
            if (key := attempt_key(obj)) is not None:
                groups[key][1].append(obj)
        now = self._clock()
        out: dict[tuple[int, int], AttemptStatus] = {}
        with self._lock:
            cluster = self._cluster
            for key, (key_pods, key_jobs) in groups.items():
                track = self._tracks.get(key)
                if key in self._verdicts:
                    out[key] = self._verdicts[key][0]
                elif track is not None and track.final:
                    out[key] = track.status  # type: ignore[assignment]
                elif track is not None and track.deleting:
                    continue  # cancelled or orphaned: on its way out
                else:
                    verdict = ks.evaluate(key_pods, key_jobs, now=now, gang_timeout_s=cluster.gang_start_timeout_s,
                                          pull_grace_s=self.settings.image_pull_grace_s,
                                          waiting_since=self._waiting_since,
                                          was_complete=track.complete if track else False)
                    out[key] = AttemptStatus(key[0], key[1], verdict.state, verdict.reason, verdict.exit_code,
                                             verdict.at or now, address=verdict.address, nodes=verdict.nodes)
            for key, (status, _) in self._verdicts.items():
                out.setdefault(key, status)
        return list(out.values())

    def capacity(self) -> CapacityReport:
        with self._lock:
            return ks.capacity(list(self._nodes.values()), list(self._usage.values()))

    def logs(self, job_id: int, attempt: int, *, pod: str = "", pod_set: str = "", tail_lines: int = 0,
             follow: bool = False, stopped: threading.Event | None = None) -> Iterator[tuple[str, str]]:
        """The container logs of the attempt's pods (see logs.py). The pods come from a fresh list (the cache may
        lag a creation), so LogsGone is raised here, before any line; an API error is a KubeError naming the pod."""
        key = (int(job_id), int(attempt))
        listed, _ = self._retrying(lambda: self._api.list("pods", label_selector=attempt_selector(*key)))
        pods = select_pods(listed, *key, pod=pod, pod_set=pod_set)
        reader = PodLogs(self._api, retrying=self._retrying, poll_s=self.settings.log_poll_s, halted=self._stop)
        if follow:
            return reader.follow(pods, tail_lines, stopped or threading.Event())
        return reader.read(pods, tail_lines, *key)

    # -- decisions ---------------------------------------------------------------------------------
    def _emit(self, key: tuple[int, int], state: str, reason: str = "", exit_code: int = 0,
              cleanup: str = ks.CLEANUP_NONE, at: float | None = None, address: str = "",
              nodes: tuple = ()) -> AttemptStatus:
        """Record and queue a report (caller holds the lock); at: when the objects show the state was
        reached (None: now)."""
        now = self._clock()
        status = AttemptStatus(key[0], key[1], state, reason, exit_code, at or now, address=address, nodes=nodes)
        track = self._tracks.setdefault(key, _Track())
        track.status, track.reported_at = status, now
        if state in FINAL_STATES:
            track.cleanup = cleanup
        self._outbox.put(status)
        log.info("kubernetes: attempt state", extra={"job_id": key[0], "attempt": key[1], "state": state,
                                                     "reason": reason})
        return status

    def _decide(self, key: tuple[int, int], state: str, reason: str) -> None:
        """A final outcome the agent decided with no objects left to show it (refused, rejected, timed out)."""
        with self._lock:
            self._known.add(key)
            track = self._tracks.setdefault(key, _Track())
            if track.final:
                return
            status = self._emit(key, state, reason)
            track.deleting = True
            self._verdicts[key] = (status, time.monotonic())

    # -- the reconciler ----------------------------------------------------------------------------
    def _reconcile_loop(self) -> None:
        next_tick = 0.0
        while not self._stop.is_set():
            with self._lock:
                if not self._dirty:
                    self._lock.wait(max(next_tick - time.monotonic(), 0.0))
                if self._stop.is_set():
                    return
                keys = set(self._dirty)
                self._dirty.clear()
                if time.monotonic() >= next_tick:
                    keys |= set(self._index) | set(self._tracks)
                    next_tick = time.monotonic() + self.settings.tick_s
                    self._prune_verdicts()
            for key in sorted(keys):
                try:
                    self._reconcile(key)
                except KubeError as exc:
                    log.warning("kubernetes: cleanup failed; tried again next tick",
                                extra={"job_id": key[0], "attempt": key[1], "error": str(exc)})
                except Exception:
                    log.exception("kubernetes: reconciling an attempt failed",
                                  extra={"job_id": key[0], "attempt": key[1]})

    def _prune_verdicts(self) -> None:
        horizon = time.monotonic() - self.settings.final_retention_s
        for key in [k for k, (_, at) in self._verdicts.items() if at < horizon]:
            del self._verdicts[key]

    def _reconcile(self, key: tuple[int, int]) -> None:
        now = self._clock()
        announce = None
        with self._lock:
            pods, jobs = self._objects_of(key)
            track = self._tracks.get(key)
            if not pods and not jobs:
                if track is None:
                    return
                if track.seen and not track.final and not track.deleting:
                    status = self._emit(key, LOST, "its objects were deleted outside Sluice")
                    self._verdicts[key] = (status, time.monotonic())
                # An attempt deleted before its objects were seen keeps its track a while: their watch
                # events may still be on their way, and must not be taken for a live attempt.
                if track.seen or time.monotonic() - track.since > self.settings.final_retention_s:
                    del self._tracks[key]
                return
            track = self._tracks.setdefault(key, _Track())
            track.seen = True
            self._note_waiting(pods, now)
            gang = ks.gang_size(pods + jobs)
            if gang and sum(1 for p in pods if not ks.terminating(p)) >= gang:
                track.complete = True
            if not track.deleting and not track.final:
                cluster = self._cluster
                verdict = ks.evaluate(pods, jobs, now=now, gang_timeout_s=cluster.gang_start_timeout_s,
                                      pull_grace_s=self.settings.image_pull_grace_s,
                                      waiting_since=self._waiting_since, was_complete=track.complete)
                if verdict.state == UNSCHEDULABLE and not self._confirmed(key, verdict, now):
                    verdict = ks.Verdict(PENDING)
                moved = verdict.state != PENDING and (track.status is None or track.status.state != verdict.state)
                # A running attempt's address is said once known, and again if it changes (never unsaid); its nodes
                # again when a pod runs on a node not said before (restarted elsewhere), not as its pods finish.
                readdressed = (not moved and verdict.state == RUNNING and track.status is not None
                               and (verdict.address not in ("", track.status.address)
                                    or bool({n for n, _ in verdict.nodes} - {n for n, _ in track.status.nodes})))
                if moved or readdressed:
                    status = self._emit(key, verdict.state, verdict.reason, verdict.exit_code, verdict.cleanup,
                                        verdict.at, verdict.address, verdict.nodes)
                    if status.state in _EVENT_REASONS:
                        announce = (sorted(jobs + pods, key=ks.name_of)[0], status)
                    if verdict.cleanup == ks.CLEANUP_ALL:
                        track.deleting = True
                        self._verdicts[key] = (status, time.monotonic())
            if track.final and not track.deleting and track.status is not None \
                    and now - track.reported_at >= self.settings.final_retention_s:
                track.deleting = True  # kept long enough to tell its story; now it goes
            # An adopted Job its owner is deleting is still released: its pods stop now, and its owner's
            # intake sees the deletion once it is no longer Sluice's.
            if track.deleting:
                doomed = [("jobs", j) for j in jobs if not ks.terminating(j) or adopted(j)]
                doomed += [("pods", p) for p in pods if not ks.terminating(p) and not _owned_by_job(p)]
            elif track.final and track.cleanup == ks.CLEANUP_UNFINISHED:
                # A Job's pods go with their Job (deleting one alone would have it replaced).
                doomed = [("jobs", j) for j in jobs if not ks.finished_job(j) and (not ks.terminating(j) or adopted(j))]
                doomed += [("pods", p) for p in pods if not ks.finished_pod(p) and not ks.terminating(p)
                           and not _owned_by_job(p)]
            else:
                doomed = []
        if announce is not None:
            self._record_event(*announce)
        for plural, obj in doomed:
            self._dispose(plural, obj)

    def _record_event(self, obj: dict, status: AttemptStatus) -> None:
        """A Kubernetes Event on one of the attempt's objects, so `kubectl describe` and `kubectl get events`
        say why Sluice gave the attempt up. Best effort: the report to the dispatcher is what counts."""
        event = event_manifest(obj, _EVENT_REASONS[status.state], status.reason, warning=True,
                               at=_rfc3339(status.at).split(".")[0] + "Z")
        try:
            self._api.create("events", event["metadata"]["namespace"], event)
        except KubeError as exc:
            log.debug("kubernetes: event not recorded", extra={"error": str(exc)})

    def _confirmed(self, key: tuple[int, int], verdict: ks.Verdict, now: float) -> bool:
        """Before giving up a gang, look at the cluster itself: the watch may lag (or be down) while the
        pods started. Called with the lock held; the lock is released for the two list calls."""
        selector = attempt_selector(*key)
        self._lock.release()
        try:
            pods, _ = self._api.list("pods", label_selector=selector)
            jobs, _ = self._api.list("jobs", label_selector=selector)
        except KubeError as exc:
            log.info("kubernetes: cannot confirm a gang timeout now; trying again next tick",
                     extra={"job_id": key[0], "attempt": key[1], "error": str(exc)})
            return False
        finally:
            self._lock.acquire()
        track = self._tracks.get(key)
        if track is None or track.deleting or track.final:
            return False
        fresh = ks.evaluate(pods, jobs, now=now, gang_timeout_s=self._cluster.gang_start_timeout_s,
                            pull_grace_s=self.settings.image_pull_grace_s, waiting_since=self._waiting_since,
                            was_complete=track.complete)
        return fresh.state == verdict.state

    def _objects_of(self, key: tuple[int, int]) -> tuple[list[dict], list[dict]]:
        pods, jobs = [], []
        for plural, namespace, name in self._index.get(key, ()):
            obj = (self._pods if plural == "pods" else self._jobs).get((namespace, name))
            if obj is not None:
                (pods if plural == "pods" else jobs).append(obj)
        return pods, jobs

    def _note_waiting(self, pods: list[dict], now: float) -> None:
        for pod in pods:
            prefix = f"{pod['metadata'].get('namespace', '')}/{pod['metadata'].get('name', '')}/"
            current = {ks.waiting_key(pod, c, r) for c, r, _ in ks.waiting_problems(pod)}
            for stale in [k for k in self._waiting_since if k.startswith(prefix) and k not in current]:
                del self._waiting_since[stale]
            for item in current:
                self._waiting_since.setdefault(item, now)

    # -- deleting ----------------------------------------------------------------------------------
    def _delete_object(self, plural: str, obj: dict) -> None:
        metadata = obj["metadata"]
        self._retrying(lambda: self._api.delete(plural, metadata["namespace"], metadata["name"]))

    def _dispose(self, plural: str, obj: dict) -> None:
        """Delete one of an attempt's objects; but a user's Job the attempt adopted is never deleted: it is handed
        back suspended, or left as it is once it finished."""
        if plural == "jobs" and adopted(obj):
            if not ks.finished_job(obj):
                self._release(obj)
            return
        self._delete_object(plural, obj)

    def _release(self, job: dict) -> None:
        """Hand an adopted Job back to its owner, suspended (objects.py release_patch), unless it finished, went,
        or was handed back meanwhile: the patch is conditional on the version looked at, and on a conflict the
        Job is read again."""
        metadata = job["metadata"]
        namespace, name, uid, key = metadata["namespace"], metadata["name"], metadata.get("uid"), attempt_key(job)
        for _ in range(self.settings.call_attempts):
            if (job["metadata"].get("uid"), attempt_key(job)) != (uid, key) or ks.finished_job(job):
                return
            try:
                self._retrying(lambda body=release_patch(job): self._api.patch("jobs", namespace, name, body))
            except KubeError as exc:
                if exc.status not in (404, 409):
                    raise
                fresh = None if exc.status == 404 else self._retrying(lambda: self._api.read_job(namespace, name))
                if fresh is None:
                    return
                job = fresh
                continue
            log.info("kubernetes: adopted Job suspended and handed back to its owner", extra={
                "namespace": namespace, "name": name, "job_id": key[0] if key else 0})
            return
        raise KubeError(409, "Conflict", f"Job {namespace}/{name} kept changing while it was being handed back")

    def _delete_listed(self, key: tuple[int, int]) -> None:
        """Delete every object of the attempt the API lists now (not the cache: it may lag a creation).
        Jobs first: their pods go with them (foreground); pods of no Job are deleted one by one."""
        selector = attempt_selector(*key)
        jobs, _ = self._retrying(lambda: self._api.list("jobs", label_selector=selector))
        for job in jobs:
            self._dispose("jobs", job)
        pods, _ = self._retrying(lambda: self._api.list("pods", label_selector=selector))
        for pod in pods:
            if not ks.terminating(pod) and not _owned_by_job(pod):
                self._delete_object("pods", pod)

    # -- namespaces --------------------------------------------------------------------------------
    def _ensure_namespace(self, namespace: str, cluster: ClusterSettings) -> None:
        if not cluster.create_namespaces or namespace in self._namespaces_ready:
            return
        if self._retrying(lambda: self._api.read_namespace(namespace)) is None:
            body = {"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": {LABEL_MANAGED_BY: MANAGED_BY}}}
            try:
                self._retrying(lambda: self._api.create("namespaces", None, body))
            except KubeError as exc:
                if exc.status != 409:
                    if exc.transient:
                        raise
                    raise Refused(f"cannot create namespace {namespace}: {exc.message}") from exc
        self._namespaces_ready.add(namespace)

    # -- calls with backoff ------------------------------------------------------------------------
    def _retrying(self, call):
        backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        for attempt in range(self.settings.call_attempts):
            try:
                return call()
            except KubeError as exc:
                if not exc.transient or attempt == self.settings.call_attempts - 1 or self._stop.is_set():
                    raise
                delay = backoff.next(exc.retry_after)
                self.stats["backoffs"] += 1
                log.warning("kubernetes: API call failed; trying again", extra={"status": exc.status,
                                                                                "delay_s": round(delay, 2)})
                self._stop.wait(delay)
        raise AssertionError("unreachable")

    # -- watches -----------------------------------------------------------------------------------
    def _watch_loop(self, name: str, plural: str, selector: str | None) -> None:
        backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        version = ""
        replace, apply = self._feeds[name]
        while not self._stop.is_set():
            try:
                if not version:
                    items, version = self._api.list(plural, label_selector=selector)
                    self.stats[f"{name}.lists"] += 1
                    replace(items)
                    self._synced[name].set()
                opened = time.monotonic()
                events = 0
                self.stats[f"{name}.watches"] += 1
                for kind, obj in self._api.watch(plural, version, label_selector=selector,
                                                 timeout_s=self.settings.watch_timeout_s):
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind != "BOOKMARK":
                        apply(kind, obj)
                    events += 1
                    backoff.reset()
                if self._stop.is_set():
                    return
                if not events and time.monotonic() - opened < 1.0:
                    self._stop.wait(backoff.next())  # a stream that ends at once: do not spin
            except KubeError as exc:
                if self._stop.is_set():
                    return
                if exc.status == 410:
                    self.stats[f"{name}.expired"] += 1
                    log.info("kubernetes: watch expired; listing again", extra={"kind": name})
                    version = ""
                    continue
                delay = backoff.next(exc.retry_after)
                self.stats[f"{name}.backoffs"] += 1
                log.warning("kubernetes: watch failed; backing off",
                            extra={"kind": name, "status": exc.status, "delay_s": round(delay, 2)})
                self._stop.wait(delay)
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("kubernetes: watch loop failed", extra={"kind": name})
                self._stop.wait(backoff.next())

    def _replace(self, plural: str, items: list[dict]) -> None:
        """A fresh list: objects missing from it were deleted while no watch was open."""
        with self._lock:
            if plural == "nodes":
                self._nodes = {(o.get("metadata") or {}).get("name", ""): o for o in items}
                return
            present = {((o.get("metadata") or {}).get("namespace", ""), (o.get("metadata") or {}).get("name", ""))
                       for o in items}
            cached = self._pods if plural == "pods" else self._jobs
            for namespace, name in set(self._usage if plural == "pods" else self._jobs) - present:
                old = cached.get((namespace, name)) or {"metadata": {"namespace": namespace, "name": name}}
                self._apply(plural, "DELETED", old)
            for obj in items:
                self._apply(plural, "MODIFIED", obj)

    def _apply(self, plural: str, kind: str, obj: dict) -> None:
        metadata = obj.get("metadata") or {}
        namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
        with self._lock:
            if plural == "nodes":
                if kind == "DELETED":
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = obj
                return
            key = attempt_key(obj)
            store = self._pods if plural == "pods" else self._jobs
            if plural == "pods":
                if kind == "DELETED":
                    self._usage.pop((namespace, name), None)
                else:
                    self._usage[(namespace, name)] = ks.usage_of(obj)
            if kind == "DELETED" or key is None:
                store.pop((namespace, name), None)
            else:
                store[(namespace, name)] = obj
            if key is not None:
                if kind == "DELETED":
                    self._index[key].discard((plural, namespace, name))
                    if not self._index[key]:
                        del self._index[key]
                else:
                    self._index[key].add((plural, namespace, name))
                self._dirty.add(key)
                self._lock.notify_all()

    # -- delivery ----------------------------------------------------------------------------------
    def _deliver(self) -> None:
        while True:
            status = self._outbox.get()
            if status is None:
                return
            try:
                if self._on_status is not None:
                    self._on_status(status)
            except Exception:
                log.exception("kubernetes: on_status raised", extra={"job_id": status.job_id,
                                                                     "attempt": status.attempt})
