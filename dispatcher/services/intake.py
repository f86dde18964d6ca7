"""The kubectl front door: Kubernetes Jobs that users create in a cluster's API server, which that cluster's
agent hands to the dispatcher (docs/user-guide.md, "Submitting with kubectl").

A Job comes in when it is labelled `sluice.io/queue`, created suspended, in a namespace the cluster's
object maps (`spec.kubernetes.intake`: namespace -> the Sluice user it submits as, and the queues it may
name). Each (cluster, Job uid) becomes one Sluice job once and for ever (store/intake.py), so that an agent
restart, a dispatcher restart or a re-list never submits it twice; the answer to every later mention of the
Job is where its job stands, which the agent mirrors on the Job. A Job being deleted cancels its job.
A Job that cannot be submitted is answered with why (one line) and nothing is written for it; the others
of the same message are not held up by it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from dispatcher.errors import DispatcherError
from dispatcher.services import reporting, submitting
from dispatcher.store import clusters as cluster_store
from dispatcher.store import intake as store
from dispatcher.store.database import Session
from dispatcher.store.tokens import Principal
from sluice import _validate as v
from sluice._validate import SpecError
from sluice.spec import KUBERNETES_API_VERSION, Origin, job_from_document

log = logging.getLogger(__name__)
QUEUE_LABEL = "sluice.io/queue"
MAX_JOBS = 500  # Jobs in one intake message at most (the agent sends more in several)
GENERATED_LABELS = ("controller-uid", "job-name", "batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name")


@dataclass(frozen=True)
class Mention:
    """A Job as the agent saw it: new, changed, still open, or being deleted."""

    uid: str
    namespace: str
    name: str
    document: dict  # the Job object (metadata, spec), as the API server holds it
    deleting: bool = False  # its deletion has begun (Sluice's finalizer holds it until its job is cancelled)


@dataclass(frozen=True)
class Answer:
    """What the agent mirrors on the Job: its Sluice job and where that stands, or why it was refused."""

    uid: str
    job_id: int = 0
    state: str = ""
    reason: str = ""
    cluster: str = ""  # where its attempt runs or ran
    attempt: int = 0
    error: str = ""  # not submitted: why (nothing was written for it)


def receive(session: Session, cluster: str, mentions: list[Mention]) -> list[Answer]:
    """Submit the Jobs not seen before, cancel the jobs of Jobs being deleted, and answer each mention, in
    order, in the caller's transaction."""
    store.lock(session, cluster)
    intake = cluster_store.get_cluster(session, cluster).spec.get("spec", {}).get("kubernetes", {}).get("intake", {})
    known = store.known(session, cluster, [m.uid for m in mentions])
    errors: dict[str, str] = {}
    for mention in mentions:
        if mention.uid in known or mention.deleting:
            continue
        try:
            with session.begin_nested():
                known[mention.uid] = _submit(session, cluster, intake, mention)
        except (DispatcherError, SpecError) as exc:
            errors[mention.uid] = str(exc)
    for mention in mentions:
        if mention.deleting and mention.uid in known:
            _cancel(session, cluster, known[mention.uid], mention)
    standing = store.standings(session, list(known.values()))
    answers = []
    for mention in mentions:
        job = standing.get(known.get(mention.uid, 0))
        if job is None:
            answers.append(Answer(mention.uid, error=errors.get(mention.uid, "")))
        else:
            answers.append(Answer(mention.uid, job.job_id, job.state, job.reason, job.cluster, job.attempt))
    return answers


def _submit(session: Session, cluster: str, intake: dict, mention: Mention) -> int:
    entry = intake.get(mention.namespace)
    if entry is None:
        raise SpecError("metadata.namespace", f"namespace {mention.namespace!r} is not one that cluster {cluster!r} "
                                              "takes Jobs from (its spec.kubernetes.intake)")
    doc = mention.document
    if doc.get("apiVersion") != KUBERNETES_API_VERSION or doc.get("kind") != "Job":
        raise SpecError("kind", f"only {KUBERNETES_API_VERSION} Jobs are taken, got {doc.get('apiVersion')} "
                                f"{doc.get('kind')}")
    labels = v.mapping(v.mapping(doc.get("metadata"), "metadata").get("labels"), "metadata.labels")
    queue = labels.get(QUEUE_LABEL)
    if queue not in entry["queues"]:
        raise SpecError(f"metadata.labels[{QUEUE_LABEL}]",
                        f"{queue!r} is not a queue namespace {mention.namespace!r} may submit to "
                        f"({', '.join(entry['queues'])})")
    if v.mapping(doc.get("spec"), "spec", required=True).get("suspend") is not True:
        raise SpecError("spec.suspend", "must be true: a Job Sluice places is created suspended (else Kubernetes "
                                        "starts it at once, in this cluster)")
    spec = job_from_document(_own_parts(doc), queue=queue)
    spec = replace(spec, origin=Origin(cluster, mention.namespace, mention.name, mention.uid))
    (job_id,) = submitting.submit(session, _submitter(entry), [spec])
    store.record(session, cluster, mention.uid, job_id, mention.namespace, mention.name)
    log.info("job submitted through the API server", extra={
        "cluster": cluster, "namespace": mention.namespace, "name": mention.name, "job_id": job_id})
    return job_id


def _own_parts(doc: dict) -> dict:
    """The Job as the job's document: without `suspend` (how the Job waits for Sluice here; the job itself
    runs as any other) and without what the API server generated for this cluster's object (the selector and
    the template labels naming its uid), which a copy of it elsewhere gets anew."""
    spec = {k: v for k, v in doc["spec"].items() if k not in ("suspend", "selector", "manualSelector")}
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("metadata"), dict):
        labels = template["metadata"].get("labels")
        if isinstance(labels, dict):
            labels = {k: v for k, v in labels.items() if k not in GENERATED_LABELS}
            template = {**template, "metadata": {**template["metadata"], "labels": labels}}
            spec["template"] = template
    return {**doc, "spec": spec}


def _submitter(entry: dict) -> Principal:
    """Whom a namespace's Jobs are submitted as: its user, a member of the queues the mapping names (the
    admin who wrote the Cluster object granted them), as an identity provider's groups would make them."""
    return Principal(entry["user"], "user", queues=frozenset(entry["queues"]))


def _cancel(session: Session, cluster: str, job_id: int, mention: Mention) -> None:
    """Cancel the job of a Job being deleted (a job already ended stays as it is). The deletion, seen by the
    cluster's agent, is the authority: whoever the namespace maps to now."""
    reporting.cancel(session, [job_id], Principal(f"kubernetes:{cluster}", "admin"),
                     reason=f"its Job {mention.namespace}/{mention.name} was deleted")
