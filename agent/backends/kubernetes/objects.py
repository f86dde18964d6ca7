"""The Kubernetes objects of an attempt: names, labels, and the manifests built from a job document.

Pure: no I/O, no clock (the creation time is passed in). `plan_attempt` turns the canonical Sluice job
document (sluice/spec.py: `spec.queue`, `spec.podSets[].{name, count, template}`, `spec.maxRuntime`) and
the cluster's settings (its Cluster object) into the manifests to create, or raises `Refused` with a
reason fit for the job's status when the attempt must not be created at all.

Names are deterministic, so creating an attempt twice is harmless (the API server answers 409):
- workload `pods`: one Pod per pod of each pod set, `<job>-<attempt>-<podset>-<index>`;
- workload `jobs`: one batch/v1 Job per pod set, `<job>-<attempt>-<podset>` (Indexed, `count` pods);
  its pods are named by the Job controller.

Every object, and every pod a Job makes, carries the labels `sluice.io/job-id`, `sluice.io/attempt`,
`sluice.io/pod-set` and `app.kubernetes.io/managed-by: sluice`, and the annotations
`sluice.io/gang-size` (pods in the whole attempt), `sluice.io/pod-set-index` (the pod set's place in the
document's podSets, which tells the attempt's first pod) and `sluice.io/created-at` (when the agent
created the attempt, RFC 3339 with microseconds, which starts the gang clock even across agent restarts).
An element of a job array (`spec.arrayId`, `spec.arrayIndex`) also carries the labels
`sluice.io/array-id` and `sluice.io/array-index`, and every container and init container of its pods
the environment variables SLUICE_ARRAY_ID and SLUICE_ARRAY_INDEX, unless it defines that name itself
(the template's own wins).

Adoption (the kubectl front door): a job submitted as a suspended batch/v1 Job through this cluster's API
server (`spec.origin` names the cluster and the Job) runs, when Sluice places it here, as that very Job.
`adoption` says whether the Job can run the attempt, `adoption_patch` makes it the attempt's (the labels
and annotations above on the Job and its pod template, `sluice.io/adopted: <job>-<attempt>`, the nodes
to keep off in its template's node affinity, unsuspended) and `release_patch` hands it back to its owner,
suspended (the nodes it was kept off stay: a Job that ran may no longer change its template). A Job is
adopted once at most.
"""
from __future__ import annotations

import copy
import hashlib
import math
import re
from dataclasses import dataclass

from agent.backends.base import array_fields, sluice_environment
from agent.backends.kubernetes.policy import as_list, violations
from agent.backends.kubernetes.settings import WORKLOAD_JOBS, ClusterSettings
from sluice.quantity import QuantityError, parse_duration

LABEL_JOB_ID = "sluice.io/job-id"
LABEL_ATTEMPT = "sluice.io/attempt"
LABEL_POD_SET = "sluice.io/pod-set"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_ARRAY_ID = "sluice.io/array-id"
LABEL_ARRAY_INDEX = "sluice.io/array-index"
MANAGED_BY = "sluice"
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

ANNOTATION_GANG_SIZE = "sluice.io/gang-size"
ANNOTATION_CREATED_AT = "sluice.io/created-at"
ANNOTATION_MAX_RUNTIME = "sluice.io/max-runtime"
ANNOTATION_POD_INDEX = "sluice.io/pod-index"
ANNOTATION_POD_SET_INDEX = "sluice.io/pod-set-index"
ANNOTATION_ADOPTED = "sluice.io/adopted"  # on a user's Job that ran an attempt: `<job>-<attempt>`

JOB_CONTROLLER = "kubernetes.io/job-controller"  # a Job's spec.managedBy when Kubernetes' own controller runs it
ADOPT, ADOPTED, COPY = "adopt", "adopted", "copy"

RESTART_LIMIT = 6  # in-place restarts (restartPolicy OnFailure) before a pod counts as failed: the Job default

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_JOB_NAME = 52  # a Job's pods are named <job>-<index>-<5 chars>: keep them within 63


class Refused(Exception):
    """The attempt must not be created; the message is the attempt's FAILED reason."""


@dataclass(frozen=True)
class AttemptPlan:
    job_id: int
    attempt: int
    namespace: str
    workload: str
    gang_size: int  # pods in the whole attempt
    manifests: tuple[dict, ...]  # in creation order; Pods (workload pods) or Jobs (workload jobs)
    marks: tuple[tuple[dict[str, str], dict[str, str]], ...] = ()  # per pod set: Sluice's labels, annotations


def pod_name(job_id: int, attempt: int, pod_set: str, index: int) -> str:
    return f"{job_id}-{attempt}-{pod_set}-{index}"


def job_name(job_id: int, attempt: int, pod_set: str) -> str:
    name = f"{job_id}-{attempt}-{pod_set}"
    if len(name) <= _MAX_JOB_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    head = name[: _MAX_JOB_NAME - 7].rstrip("-")
    return f"{head}-{digest}"


def attempt_labels(job_id: int, attempt: int, pod_set: str) -> dict[str, str]:
    return {LABEL_JOB_ID: str(job_id), LABEL_ATTEMPT: str(attempt), LABEL_POD_SET: pod_set,
            LABEL_MANAGED_BY: MANAGED_BY}


def attempt_selector(job_id: int, attempt: int) -> str:
    return f"{MANAGED_SELECTOR},{LABEL_JOB_ID}={job_id},{LABEL_ATTEMPT}={attempt}"


def attempt_key(obj: dict) -> tuple[int, int] | None:
    """(job id, attempt) from an object's labels; None for an object Sluice does not manage."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
        return None
    try:
        return int(labels[LABEL_JOB_ID]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None


def event_manifest(obj: dict, reason: str, message: str, *, warning: bool, at: str) -> dict:
    """A Kubernetes Event about a Pod or Job (`at`: RFC 3339, whole seconds), so that `kubectl describe`
    and `kubectl get events` tell what Sluice did with it."""
    metadata = obj.get("metadata") or {}
    is_job = "completions" in (obj.get("spec") or {}) or obj.get("kind") == "Job"
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{metadata.get('name', 'sluice')}.", "namespace": metadata.get("namespace")},
            "involvedObject": {"apiVersion": "batch/v1" if is_job else "v1", "kind": "Job" if is_job else "Pod",
                               "name": metadata.get("name"), "namespace": metadata.get("namespace"),
                               "uid": metadata.get("uid")},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "source": {"component": "sluice-agent"}, "firstTimestamp": at, "lastTimestamp": at, "count": 1}


def plan_attempt(job_id: int, attempt: int, document: dict, cluster: ClusterSettings, created_at: str,
                 avoid_nodes: tuple[str, ...] = ()) -> AttemptPlan:
    """The manifests of one attempt, or Refused (pod policy, namespace, restart policy, malformed document).
    avoid_nodes: the nodes its pods must not be bound to (DispatchAttempt.avoid_nodes)."""
    spec = document.get("spec") if isinstance(document, dict) else None
    if not isinstance(spec, dict):
        raise Refused("the job document has no spec")
    queue = spec.get("queue")
    if not isinstance(queue, str) or not queue:
        raise Refused("the job document names no queue, so it maps to no namespace")
    namespace = cluster.namespace_for(queue)
    if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise Refused(f"queue {queue!r} maps to namespace {namespace!r}, which is not a Kubernetes namespace name; "
                      "map it in the Cluster's spec.kubernetes.namespaces")
    deadline = None
    if spec.get("maxRuntime") is not None:
        try:
            deadline = max(1, math.ceil(parse_duration(spec["maxRuntime"])))
        except QuantityError as exc:
            raise Refused(f"spec.maxRuntime: {exc}") from None
    pod_sets = spec.get("podSets")
    if not isinstance(pod_sets, list) or not pod_sets:
        raise Refused("the job document has no pod sets")
    problems: list[str] = []
    prepared = []
    for i, pod_set in enumerate(pod_sets):
        if not isinstance(pod_set, dict) or not isinstance(pod_set.get("template"), dict):
            raise Refused(f"spec.podSets[{i}] has no pod template")
        name = pod_set.get("name")
        count = pod_set.get("count")
        if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name) or not isinstance(count, int) or count < 1:
            raise Refused(f"spec.podSets[{i}] needs a DNS-label name and a positive count")
        template = pod_set["template"]
        if not isinstance(template.get("spec"), dict):
            raise Refused(f"spec.podSets[{i}].template.spec: must be a mapping")
        metadata = template.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise Refused(f"spec.podSets[{i}].template.metadata: must be a mapping")
        for key in ("labels", "annotations"):  # Sluice's own go beside the template's, on every object
            if not isinstance((metadata or {}).get(key) or {}, dict):
                raise Refused(f"spec.podSets[{i}].template.metadata.{key}: must be a mapping")
        for problem in violations(template, namespace, cluster):
            problems.append(f"pod set {name}: {problem}")
        restart = template["spec"].get("restartPolicy")
        if restart not in (None, "Never", "OnFailure"):
            problems.append(f"pod set {name}: restartPolicy {restart!r} never lets a pod finish "
                            "(use Never or OnFailure)")
        prepared.append((name, count, template))
    if problems:
        raise Refused("refused by the cluster's pod policy: " + "; ".join(problems))
    gang_size = sum(count for _, count, _ in prepared)
    array = array_fields(document)
    array_labels = {label: str(array[key]) for key, label in (("arrayId", LABEL_ARRAY_ID),
                                                              ("arrayIndex", LABEL_ARRAY_INDEX)) if key in array}
    environment = sluice_environment(document)
    manifests, marks = [], []
    for order, (name, count, template) in enumerate(prepared):
        labels = {**attempt_labels(job_id, attempt, name), **array_labels}
        annotations = {ANNOTATION_GANG_SIZE: str(gang_size), ANNOTATION_POD_SET_INDEX: str(order),
                       ANNOTATION_CREATED_AT: created_at}
        if deadline is not None:
            annotations[ANNOTATION_MAX_RUNTIME] = str(spec["maxRuntime"]).strip()
        marks.append((dict(labels), dict(annotations)))
        metadata, pod_spec = _pod_parts(template, labels, annotations, deadline, environment)
        _kept_off(pod_spec, avoid_nodes)
        if cluster.workload == WORKLOAD_JOBS:
            restart = pod_spec["restartPolicy"]
            manifests.append({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": job_name(job_id, attempt, name), "namespace": namespace,
                             "labels": dict(labels), "annotations": dict(annotations)},
                "spec": {"parallelism": count, "completions": count, "completionMode": "Indexed",
                         # Sluice owns retries (a new attempt, anywhere): the Job never replaces a failed pod.
                         "backoffLimit": 0 if restart == "Never" else RESTART_LIMIT,
                         "template": {"metadata": metadata, "spec": pod_spec}}})
        else:
            for index in range(count):
                pod_metadata = copy.deepcopy(metadata)
                pod_metadata["name"] = pod_name(job_id, attempt, name, index)
                pod_metadata["namespace"] = namespace
                pod_metadata["annotations"][ANNOTATION_POD_INDEX] = str(index)
                manifests.append({"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata,
                                  "spec": copy.deepcopy(pod_spec)})
    return AttemptPlan(job_id, attempt, namespace, cluster.workload, gang_size, tuple(manifests), tuple(marks))


# -- adoption ----------------------------------------------------------------------------------------

def origin_of(document: dict) -> dict[str, str] | None:
    """The Job a job was submitted as through a cluster's API server (`spec.origin`: cluster, namespace, name,
    uid), or None."""
    spec = document.get("spec") if isinstance(document, dict) else None
    origin = spec.get("origin") if isinstance(spec, dict) else None
    if not isinstance(origin, dict) or not all(isinstance(origin.get(k), str) and origin[k]
                                               for k in ("cluster", "namespace", "name", "uid")):
        return None
    return {k: origin[k] for k in ("cluster", "namespace", "name", "uid")}


def adoption_mark(job_id: int, attempt: int) -> str:
    return f"{job_id}-{attempt}"


def adopted(obj: dict) -> bool:
    """Whether an object is a user's Job that Sluice adopted (never to be deleted by Sluice)."""
    return bool(((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ADOPTED))


def adoption(job: dict | None, document: dict, job_id: int, attempt: int) -> tuple[str, str]:
    """What to do with the Job a job was submitted as (`job`: as read now, None when there is none) for one of
    its attempts that Sluice placed on the Job's own cluster: (ADOPT, ""), (ADOPTED, "") when this attempt
    adopted it already, or (COPY, why) when it cannot run the attempt itself and a copy is made instead."""
    origin = origin_of(document) or {}
    if job is None:
        return COPY, f"Job {origin.get('namespace')}/{origin.get('name')} does not exist"
    metadata, spec = job.get("metadata") or {}, job.get("spec") or {}
    mark = (metadata.get("annotations") or {}).get(ANNOTATION_ADOPTED)
    if metadata.get("uid") != origin.get("uid"):
        return COPY, f"it is another Job of the same name (uid {metadata.get('uid')})"
    if mark == adoption_mark(job_id, attempt):
        return ADOPTED, ""
    if mark:
        return COPY, f"it ran attempt {mark} (a Job is adopted once)"
    if metadata.get("deletionTimestamp"):
        return COPY, "it is being deleted"
    if spec.get("suspend") is not True:
        return COPY, "it is not suspended"
    if (job.get("status") or {}).get("startTime"):
        return COPY, "it ran before (status.startTime), so its pod template can no longer change"
    if spec.get("managedBy") not in (None, JOB_CONTROLLER):
        return COPY, f"spec.managedBy {spec.get('managedBy')!r}: Kubernetes' Job controller does not run it"
    pod_sets = ((document.get("spec") or {}).get("podSets") or [])
    count = pod_sets[0].get("count") if len(pod_sets) == 1 and isinstance(pod_sets[0], dict) else None
    # Its parallelism may have changed since it was submitted; Sluice placed the job's count of pods.
    if spec.get("parallelism", 1) != count or spec.get("completions") not in (None, count):
        return COPY, (f"it has parallelism {spec.get('parallelism', 1)} and completions {spec.get('completions')}, "
                      f"the job {count} pods")
    return ADOPT, ""


def adoption_patch(job: dict, labels: dict[str, str], annotations: dict[str, str], mark: str,
                   avoid_nodes: tuple[str, ...] = ()) -> dict:
    """The one merge patch that makes a user's suspended Job run an attempt: the attempt's labels and annotations
    on the Job and on its pod template (so its pods are the attempt's), the adoption mark, unsuspended;
    conditional on the version it was decided on (409 when the Job changed since). `avoid_nodes`: the nodes
    its pods must keep off (DispatchAttempt.avoid_nodes), added to the template's node affinity as for a copy
    (a suspended Job that never started may change its node affinity, as Kueue's admission does)."""
    template: dict = {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}}
    if avoid_nodes:
        pod = copy.deepcopy(((job.get("spec") or {}).get("template") or {}).get("spec") or {})
        _kept_off(pod, avoid_nodes)
        affinity = pod.get("affinity")
        if isinstance(affinity, dict) and isinstance(affinity.get("nodeAffinity"), dict):
            # A merge patch replaces a list whole: the terms go as the Job's own, each with the nodes kept off.
            template["spec"] = {"affinity": {"nodeAffinity": affinity["nodeAffinity"]}}
    return {"metadata": {"resourceVersion": (job.get("metadata") or {}).get("resourceVersion"),
                         "labels": dict(labels), "annotations": {**annotations, ANNOTATION_ADOPTED: mark}},
            "spec": {"suspend": False, "template": template}}


def release_patch(job: dict) -> dict:
    """Hands an adopted Job back to its owner when its attempt ends unfinished: suspended again (the Job
    controller deletes its active pods) and no longer labelled managed-by Sluice, so no agent takes it for a
    live attempt again (the other labels and the annotations stay, as a record). Conditional on the version
    it was decided on: a Job that finished since, or was created again under its name, is not touched."""
    return {"metadata": {"resourceVersion": (job.get("metadata") or {}).get("resourceVersion"),
                         "labels": {LABEL_MANAGED_BY: None}},
            "spec": {"suspend": True}}


def _pod_parts(template: dict, labels: dict, annotations: dict, deadline: int | None,
               environment: dict[str, str]) -> tuple[dict, dict]:
    """Metadata and spec of one pod of a pod set: the template's, with Sluice's labels and annotations on
    top, Sluice's environment added to every container and init container (a name the container defines
    keeps its value), restartPolicy Never unless it says OnFailure, maxRuntime as activeDeadlineSeconds,
    and every quantity written as a string (the API accepts numbers, the typed client does not)."""
    source = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
    metadata = {"labels": {**(source.get("labels") or {}), **labels},
                "annotations": {**(source.get("annotations") or {}), **annotations}}
    spec = copy.deepcopy(template.get("spec") or {})
    spec["restartPolicy"] = spec.get("restartPolicy") or "Never"
    if deadline is not None:
        current = spec.get("activeDeadlineSeconds")
        spec["activeDeadlineSeconds"] = min(current, deadline) if isinstance(current, int) and current > 0 else deadline
    if environment:
        _add_environment(spec, environment)
    _quantities_as_strings(spec)
    return metadata, spec


def _kept_off(spec: dict, nodes: tuple[str, ...]) -> None:
    """Keep the pods off `nodes`: a required node affinity on the node's name (matchFields metadata.name NotIn),
    added to each of the pod's own required terms, which are ORed (so each must carry it). A malformed
    affinity is left for the API server to refuse, in its words."""
    if not nodes:
        return
    off = {"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {}) if isinstance(affinity, dict) else None
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}) \
        if isinstance(node_affinity, dict) else None
    if not isinstance(required, dict):
        return
    terms = required.get("nodeSelectorTerms") or [{}]
    if isinstance(terms, list) and all(isinstance(t, dict) and isinstance(t.get("matchFields") or [], list)
                                       for t in terms):
        required["nodeSelectorTerms"] = [{**t, "matchFields": [*(t.get("matchFields") or []), off]} for t in terms]


def _add_environment(spec: dict, environment: dict[str, str]) -> None:
    for group in ("initContainers", "containers"):
        for container in as_list(spec.get(group)):
            if not isinstance(container, dict):
                continue
            env = as_list(container.get("env"))
            defined = {item.get("name") for item in env if isinstance(item, dict) and isinstance(item.get("name"), str)}
            container["env"] = env + [{"name": name, "value": value} for name, value in environment.items()
                                      if name not in defined]


def _text(value: object) -> object:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else format(value, "g")
    return value


def _quantities_as_strings(spec: dict) -> None:
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for container in as_list(spec.get(group)):
            resources = container.get("resources") if isinstance(container, dict) else None
            if isinstance(resources, dict):
                for key in ("requests", "limits"):
                    if isinstance(resources.get(key), dict):
                        resources[key] = {k: _text(v) for k, v in resources[key].items()}
    if isinstance(spec.get("overhead"), dict):
        spec["overhead"] = {k: _text(v) for k, v in spec["overhead"].items()}
    if isinstance(spec.get("resources"), dict):
        for key in ("requests", "limits"):
            if isinstance(spec["resources"].get(key), dict):
                spec["resources"][key] = {k: _text(v) for k, v in spec["resources"][key].items()}
    for volume in as_list(spec.get("volumes")):
        empty_dir = volume.get("emptyDir") if isinstance(volume, dict) else None
        if isinstance(empty_dir, dict) and "sizeLimit" in empty_dir:
            empty_dir["sizeLimit"] = _text(empty_dir["sizeLimit"])
