"""The kubectl front door, the agent's side: Jobs users create in this cluster's API server go to the
dispatcher, and each mirrors where its Sluice job stands (docs/user-guide.md, "Submitting with kubectl").

A Job is taken when it is labelled `sluice.io/queue` and sits in a namespace the Cluster object's
`spec.kubernetes.intake` maps. The dispatcher decides everything else (whether it may be submitted, as whom,
and that each uid is submitted once); this side only reports what it sees and mirrors the answers:

- annotations `sluice.io/job-id`, `sluice.io/state` (the job's state, or REFUSED), `sluice.io/cluster`
  (where it runs or ran) and `sluice.io/reason`;
- a condition of type `SluiceJob` (reason: the state, message: what happened) in the Job's status;
- an Event at each change of state, so `kubectl describe job` tells the story;
- the finalizer `sluice.io/cancel-on-delete` while the job is open: deleting the Job then cancels its
  Sluice job everywhere before the Job goes (the finalizer comes off once the job has ended).

Mentions are sent when a Job is new or changed, and again every `refresh_s` while its job is open (the
answers carry its progress); a refused Job is sent again only once its spec, labels or annotations change.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from agent.backends.base import IntakeAnswer, IntakeMention
from agent.backends.kubernetes.api import KubeApi, KubeError
from agent.backends.kubernetes.objects import adopted, attempt_key, event_manifest

log = logging.getLogger(__name__)

QUEUE_LABEL = "sluice.io/queue"
INTAKE_SELECTOR = QUEUE_LABEL  # the label exists
FINALIZER = "sluice.io/cancel-on-delete"
JOB_ID_ANNOTATION = "sluice.io/job-id"
STATE_ANNOTATION = "sluice.io/state"
CLUSTER_ANNOTATION = "sluice.io/cluster"
REASON_ANNOTATION = "sluice.io/reason"
CONDITION = "SluiceJob"
REFUSED = "REFUSED"
FINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
_MIRRORED = (JOB_ID_ANNOTATION, STATE_ANNOTATION, CLUSTER_ANNOTATION, REASON_ANNOTATION)


@dataclass
class _Seen:
    job: dict  # the Job as last seen
    sent: tuple | None = None  # the signature last sent
    sent_at: float = float("-inf")
    answer: IntakeAnswer | None = None  # the last answer
    refused: tuple | None = None  # the signature the dispatcher refused
    gone: bool = False  # deleted from the API server (its deletion still to be told, if it was sent)


class JobIntake:
    """The Jobs of the intake namespaces, what was sent about each, and the mirroring of the answers."""

    def __init__(self, api: KubeApi, *, refresh_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self._api = api
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}  # by uid
        self._namespaces: frozenset[str] = frozenset()

    def configure(self, namespaces: frozenset[str]) -> None:
        with self._lock:
            self._namespaces = frozenset(namespaces)

    # -- what the watch sees -----------------------------------------------------------------------
    def replace(self, items: list[dict]) -> None:
        """A fresh list: a Job missing from it was deleted while no watch was open."""
        present = {_uid(o) for o in items}
        with self._lock:
            for uid, seen in self._seen.items():
                if uid not in present:
                    seen.gone = True
        for obj in items:
            self.observe("MODIFIED", obj)

    def observe(self, kind: str, obj: dict) -> None:
        uid = _uid(obj)
        # Sluice's own objects are never taken in; a user's Job that runs its attempt in place (adopted) still is.
        if not uid or (attempt_key(obj) is not None and not adopted(obj)):
            return
        with self._lock:
            seen = self._seen.get(uid)
            if kind == "DELETED":
                if seen is not None:
                    seen.gone = True
                    if seen.sent is None:
                        del self._seen[uid]
                return
            if seen is None:
                self._seen[uid] = _Seen(obj)
            else:
                seen.job = obj

    # -- the link ----------------------------------------------------------------------------------
    def pending(self) -> list[IntakeMention]:
        """What to tell the dispatcher now; Jobs gone whose job is over are forgotten."""
        now = self._clock()
        out = []
        with self._lock:
            for uid, seen in list(self._seen.items()):
                metadata = seen.job.get("metadata") or {}
                if metadata.get("namespace") not in self._namespaces:
                    continue
                deleting = seen.gone or bool(metadata.get("deletionTimestamp"))
                over = seen.answer is not None and (seen.answer.state in FINAL or not seen.answer.job_id)
                if seen.gone and (seen.sent is None or over):
                    del self._seen[uid]
                    continue
                signature = _signature(seen.job, deleting)
                if over and not seen.answer.job_id and (deleting or signature == seen.refused):
                    continue  # refused: sent again once changed
                if over and seen.answer.job_id and _mirrored(seen.job, seen.answer):
                    continue  # its job ended and the Job says so
                if signature == seen.sent and now - seen.sent_at < self._refresh_s:
                    continue
                seen.sent, seen.sent_at = signature, now
                out.append(IntakeMention(uid, metadata["namespace"], metadata.get("name", ""), _document(seen.job),
                                         deleting))
        return out

    def answered(self, answers: list[IntakeAnswer]) -> None:
        """Mirror each answer on its Job (best effort: a failed write is tried again with the next answer)."""
        for answer in answers:
            with self._lock:
                seen = self._seen.get(answer.uid)
                if seen is None:
                    continue
                seen.answer = answer
                if not answer.job_id:
                    seen.refused = seen.sent
                job, gone = seen.job, seen.gone
            if gone:
                continue
            try:
                self._mirror(job, answer)
            except KubeError as exc:
                log.info("kubernetes: a Job's Sluice state not written; trying again", extra={
                    "namespace": (job.get("metadata") or {}).get("namespace"), "error": str(exc)})
                with self._lock:
                    seen.sent_at = float("-inf")  # asked again at once: its answer is mirrored then

    def _mirror(self, job: dict, answer: IntakeAnswer) -> None:
        """Write the answer onto the Job where it does not show it yet: the annotations and finalizer (against
        the Job as read now, conditional on its version), an Event when the state changed, the condition."""
        if _mirrored(job, answer):
            return
        state = answer.state if answer.job_id else REFUSED
        condition = _condition(answer, state, self._now())
        metadata = job.get("metadata") or {}
        namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
        job = self._api.read_job(namespace, name)  # the watch may lag behind this agent's own last write
        if job is None or _uid(job) != answer.uid:
            return
        before = ((job.get("metadata") or {}).get("annotations") or {}).get(STATE_ANNOTATION)
        patch = _changes(job, answer, state)
        if patch is not None:
            job = self._api.patch("jobs", namespace, name, patch)
            if (job.get("metadata") or {}).get("deletionTimestamp") and not job["metadata"].get("finalizers"):
                return  # its last finalizer came off: the Job is gone
        if before != state:
            event = event_manifest({**job, "kind": "Job"}, condition["reason"], condition["message"],
                                   warning=state in (REFUSED, "FAILED"), at=self._now())
            try:
                self._api.create("events", namespace, event)
            except KubeError as exc:
                log.debug("kubernetes: event not recorded", extra={"error": str(exc)})
        if not _condition_current(job, condition):
            mine = _condition_of(job)
            if mine is not None and mine.get("reason") == condition["reason"]:
                condition["lastTransitionTime"] = mine.get("lastTransitionTime", condition["lastTransitionTime"])
            # Strategic: conditions merge by type, so the Job controller's own are left as they are.
            self._api.patch("jobs", namespace, name, {"status": {"conditions": [condition]}}, status=True,
                            strategic=True)

    @staticmethod
    def _now() -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uid(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _changes(job: dict, answer: IntakeAnswer, state: str) -> dict | None:
    """The merge patch that makes the Job's annotations and finalizers say the answer (None: they do),
    conditional on the version it was computed from (the finalizers list is written whole)."""
    metadata = job.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    changed = {k: v for k, v in _annotations(answer, state).items() if annotations.get(k) != v}
    finalizers = list(metadata.get("finalizers") or [])
    keep = bool(answer.job_id) and state not in FINAL and not metadata.get("deletionTimestamp")
    wanted = [*finalizers, FINALIZER] if keep and FINALIZER not in finalizers else [
        f for f in finalizers if f != FINALIZER or keep]
    if not changed and wanted == finalizers:
        return None
    patch: dict = {"metadata": {"resourceVersion": metadata.get("resourceVersion")}}
    if changed:
        patch["metadata"]["annotations"] = changed
    if wanted != finalizers:
        patch["metadata"]["finalizers"] = wanted
    return patch


def _condition_of(job: dict) -> dict | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None)


def _condition_current(job: dict, condition: dict) -> bool:
    mine = _condition_of(job)
    return mine is not None and (mine.get("reason"), mine.get("message")) == (condition["reason"], condition["message"])


def _mirrored(job: dict, answer: IntakeAnswer) -> bool:
    """Whether the Job already says all of the answer (annotations, finalizer, condition)."""
    state = answer.state if answer.job_id else REFUSED
    return _changes(job, answer, state) is None and _condition_current(job, _condition(answer, state, ""))


def _signature(job: dict, deleting: bool) -> tuple:
    """What, changed, makes a Job worth sending again: its spec, its labels, its own annotations."""
    metadata = job.get("metadata") or {}
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k not in _MIRRORED}
    return (metadata.get("generation"), repr(sorted((metadata.get("labels") or {}).items())),
            repr(sorted(annotations.items())), deleting)


def _document(job: dict) -> dict:
    """The Job as the dispatcher reads it: its name, labels, annotations of its own and spec."""
    metadata = job.get("metadata") or {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace"),
                         "uid": metadata.get("uid"), "labels": dict(metadata.get("labels") or {}),
                         "annotations": {k: v for k, v in (metadata.get("annotations") or {}).items()
                                         if k not in _MIRRORED}},
            "spec": job.get("spec") or {}}


def _annotations(answer: IntakeAnswer, state: str) -> dict[str, str]:
    reason = answer.error or answer.reason
    return {JOB_ID_ANNOTATION: str(answer.job_id) if answer.job_id else "", STATE_ANNOTATION: state,
            CLUSTER_ANNOTATION: answer.cluster, REASON_ANNOTATION: reason[:1024]}


_WORDS = {"WAITING": "Waiting", "QUEUED": "Queued", "DISPATCHED": "Dispatched", "RUNNING": "Running",
          "SUCCEEDED": "Succeeded", "FAILED": "Failed", "CANCELLED": "Cancelled", REFUSED: "Refused"}


def _condition(answer: IntakeAnswer, state: str, now: str) -> dict:
    """The SluiceJob condition: the job's state as its reason, what happened in words as its message."""
    if not answer.job_id:
        message = f"not submitted to Sluice: {answer.error}"
    elif state in ("DISPATCHED", "RUNNING"):
        message = f"Sluice job {answer.job_id}: {state.lower()} on cluster {answer.cluster} (attempt {answer.attempt})"
    else:
        where = f" on cluster {answer.cluster}" if answer.cluster and state in FINAL else ""
        message = f"Sluice job {answer.job_id}: {state.lower()}{where}{f': {answer.reason}' if answer.reason else ''}"
    return {"type": CONDITION, "status": "True", "reason": _WORDS.get(state, state.title()),
            "message": message[:1024], "lastProbeTime": now, "lastTransitionTime": now}
