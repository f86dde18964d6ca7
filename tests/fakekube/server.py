"""A fake Kubernetes API server for the agent's tests: the real REST wire format over HTTP on loopback.

It is the one fake in the test suite (the process boundary the kubernetes backend talks across), so the
real `kubernetes` client library runs unchanged against it. It serves what the agent uses:

- namespaces and nodes (cluster-scoped), pods, events and batch/v1 jobs (namespaced, and listed across
  all namespaces), apiextensions.k8s.io/v1 customresourcedefinitions (cluster-scoped) and the custom
  resources of the CRDs created (see below): create, get, list, watch, update (PUT), patch, delete and
  deletecollection, and the `status` subresource (GET, PUT, PATCH) of every kind that has one (all but
  events; a custom resource when its CRD version declares `subresources.status`);
- list and watch with `labelSelector` (=, ==, !=, in, notin, exists, !exists) and `fieldSelector`
  (=, ==, != on dotted paths such as status.phase, spec.nodeName, involvedObject.name);
- watch (`?watch=true`): a chunked stream of JSON lines `{"type": ..., "object": ...}` from a
  resourceVersion, with `allowWatchBookmarks` and `timeoutSeconds`; a resourceVersion older than the
  retained history gets the API server's `ERROR` event with a 410 Expired Status, a list request with
  one gets a 410 response; with selectors, a change that brings an object into the selection comes as
  ADDED and one that takes it out as DELETED (the object as it was); the watch of a custom resource ends
  when its CRD goes;
- pod logs (`GET .../pods/{name}/log`, text/plain) with `container`, `tailLines`, `timestamps`,
  `sinceSeconds`, `limitBytes`, `previous` and `follow`: a chunked stream of the lines so far, then of
  each line appended, ending when the container terminates, the pod is deleted or the server stops. An
  unknown pod is 404, a pod of several containers with none named 400 (as is a container that has not
  started, with the API server's "is waiting to start" message). A pod's containers log "started" when
  they start and "exited with code N" when they end; tests add lines with `append_log`;
- PATCH (tests/fakekube/patch.py) by Content-Type: `application/merge-patch+json` (RFC 7386),
  `application/strategic-merge-patch+json` (built-in kinds: maps merge; `metadata.finalizers` is a set
  with `$deleteFromPrimitiveList/finalizers`; `status.conditions`, owner references and the pod
  template's containers, env, ports, volume mounts and volumes merge by their patchMergeKey, `$patch:
  delete|replace` and `$retainKeys` work; other lists replace) and `application/json-patch+json`
  (RFC 6902 add, remove, replace, move, copy, test; a failed op is 422). Anything else, server-side apply
  included, is 415 (strategic merge too, on a custom resource). The Python client sends a dict as a
  strategic merge patch and a list as a JSON patch (CustomObjectsApi: merge patch); pass `_content_type`
  for another. A `metadata.resourceVersion` in the patch is a precondition;
- PUT and PATCH write as the API server's update does: a stale `metadata.resourceVersion` is 409
  Conflict ("the object has been modified; please apply your changes to the latest version and try
  again"); one left out is an unconditional update for built-in kinds and 422 for custom resources and
  CRDs; the name and namespace are the URL's (400 otherwise); uid, creationTimestamp and the deletion
  fields are the server's; the result is validated as a create is, plus what an update may not change
  (below); a write that changes nothing (on a built-in kind, adding only empty maps or lists is
  nothing) answers 200 with the same resourceVersion and no event, any other bumps it and emits MODIFIED.
  Times a client writes as other RFC 3339 forms (+00:00) are stored as the API server stores them (UTC,
  seconds, Z). `dryRun=All` validates and answers without writing;
- the status subresource: a write to an object keeps its status, a write to its /status keeps its spec
  (a Job's, a node's, ...: metadata changes through /status are kept, as the built-in status strategies
  do) or, for a custom resource, everything but `.status`. A create drops a custom object's status.
  `metadata.generation` is 1 on create (Jobs, custom objects, CRDs) and goes up when the spec changes
  (a custom object: anything but metadata and, with a status subresource, status) and when a deletion
  starts;
- finalizers: deleting an object with `metadata.finalizers` sets `deletionTimestamp` (and
  `deletionGracePeriodSeconds` 0), emits MODIFIED and keeps it (200 with the object); a write that
  removes the last finalizer deletes it (DELETED); no new finalizer may be added meanwhile ("Forbidden:
  no new finalizers can be added if the object is being deleted"); deleting it again changes nothing.
  Finalizer names are qualified names; "orphan" and "foregroundDeletion" exclude each other;
- delete with `propagationPolicy` (query or DeleteOptions body) and DeleteOptions `preconditions`
  (uid, resourceVersion: 409 when they do not hold): pods on a node terminate gracefully
  (deletionTimestamp first, gone `pod_termination_s` later, or held with grace 0 by finalizers); a Job
  deleted `Foreground` keeps a `foregroundDeletion` finalizer until its pods are gone, `Background` goes
  at once (or when its finalizers are gone) and its pods after, `Orphan` leaves them without an owner (a
  Job deleted with no policy is orphaning, batch/v1's default; kubectl sends Background); other kinds
  treat every policy as Background (they have no dependents here); the legacy `orphanDependents` works.
  A delete that removed the object answers a Success Status (pods and namespaces: the object), one that
  did not the object;
- the API server's answers: 201 on create, 409 AlreadyExists, 404 NotFound (also for a missing
  namespace, `jobs.batch "x" not found`), 422 Invalid (`Job.batch "j" is invalid: spec.x: ...`, several
  errors in brackets, each a cause with its field and reason) after validating every object written
  with `kubernetes-validate` (the real OpenAPI schemas, shipped offline) plus the semantic checks listed
  in `_semantic_errors`, 400 for a resourceVersion on a create, and 429 or 5xx on demand (`fail`);
- what an update may not change: a Job's selector, completionMode, managedBy, podFailurePolicy,
  successPolicy and backoffLimitPerIndex, its completions (but an Indexed Job's, in step with its
  parallelism) and its pod template ("field is immutable"), except that while it is suspended and has
  never started (no status.startTime) the template's labels and annotations, node selector, tolerations,
  scheduling gates and node affinity may change (v1.33's JobMutableNodeSchedulingDirectives); a Job's
  status may not go back on a terminal condition, lower its counters or drop an unsuspended Job's
  startTime; a pod's spec but its images, activeDeadlineSeconds, added tolerations and removed
  scheduling gates; a CRD's group, plural, kind and scope;
- CustomResourceDefinitions (tests/fakekube/schema.py): a CRD is validated with `kubernetes-validate`
  and the API server's own checks (name `plural.group`, names, exactly one storage version, a
  structural schema for each version: a `type` everywhere unless `x-kubernetes-int-or-string` or
  `x-kubernetes-preserve-unknown-fields`, no `additionalProperties` beside `properties`, no
  `uniqueItems`, valid defaults, printer columns), defaulted (singular, listKind, conversion None),
  marked NamesAccepted and Established, and its served versions are served at once at
  `/apis/GROUP/VERSION/[namespaces/NS/]PLURAL[/NAME[/status]]` with everything above. A custom object
  is kept at the storage version and served at every served version (conversion None); unknown fields
  are pruned (a `Warning: 299` header names them; `fieldValidation=Strict` makes them a 400), nulls of
  non-nullable fields dropped, defaults applied, and the object validated against the version's
  `openAPIV3Schema` (type with integer apart from number, properties, required, additionalProperties,
  items, enum, minimum/maximum, multipleOf, minLength/maxLength, pattern, minItems/maxItems,
  min/maxProperties, nullable, allOf/anyOf/oneOf/not, int-or-string, list-type set/map uniqueness;
  format and CEL `x-kubernetes-validations` are not checked) with the API server's field errors
  (`spec.weight: Invalid value: "string": spec.weight in body must be of type integer: "string"`).
  Deleting a CRD marks it Terminating (finalizer customresourcecleanup.apiextensions.k8s.io), deletes
  its objects and removes it once none is left (an object's finalizers hold it; creating one meanwhile
  is 405). A CRD update re-serves its versions;
- discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/GROUP`, `/apis/GROUP/VERSION` list the kinds
  served (custom ones included), their subresources, short names and verbs, as the dynamic client reads
  them.

A minimal Job controller creates each Job's pods (Indexed or not), owns them, counts succeeded and
failed pods and sets the SuccessCriteriaMet and Complete or FailureTarget and Failed conditions, keeping
the conditions others wrote. It honours `spec.suspend`: a suspended Job has no active pods (suspending a
running one deletes them) and the condition Suspended True (JobSuspended, "Job suspended"); resuming it
sets Suspended False (JobResumed, "Job resumed"), restarts `status.startTime` and creates its pods. It
leaves alone a Job whose `spec.managedBy` is not kubernetes.io/job-controller. It acts on every change to
a Job and to its pods (a pod that goes may be replaced). Tests act as scheduler and kubelet through
`schedule`, `run_pod` (which gives the pod an IP, 10.244.0.1 up, unless it has one), `set_pod_ip`,
`succeed_pod`, `fail_pod`, `image_pull_error`, ... or switch on `autopilot`,
which binds pending pods first-fit to Ready schedulable nodes with room, runs them and ends them
after the seconds their `fakekube.test/run-seconds` annotation says (exit code from
`fakekube.test/exit-code`), leaving pods that fit nowhere Pending with the scheduler's message. Tests act
as other clients through `put` (any kind, CRDs and custom objects included), `patch`, `delete`, and read
through `get`, `list` (custom resources named `plural.group`, or by their plural alone) and `events` (the
watch events recorded after a resourceVersion).

Every request is recorded in `requests` (method, path, query, status, content type), every delete in
`deletions`; a failure of the fake itself is answered 500 InternalError and recorded in `errors`.

Not served: server-side apply, the scale subresource, webhook conversion, managedFields, field selectors
restricted per kind, and a namespace's own finalization (a namespace goes at once with its objects).
"""
from __future__ import annotations

import contextlib
import copy
import heapq
import itertools
import json
import pathlib
import random
import re
import socket
import string
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

from tests.fakekube import schema as crdschema
from tests.fakekube.patch import (
    APPLY_PATCH_TYPES,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from tests.fakekube.schema import go_value

KUBERNETES_VERSION = "1.33"
RUN_SECONDS_ANNOTATION = "fakekube.test/run-seconds"
EXIT_CODE_ANNOTATION = "fakekube.test/exit-code"
JOB_CONTROLLER = "kubernetes.io/job-controller"
CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"


@dataclass(frozen=True)
class Resource:
    """A kind as the API server serves it at one group/version (a custom resource: one served version of its
    CustomResourceDefinition)."""
    plural: str
    kind: str
    api_version: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False  # a status subresource: writes to the object keep its status, writes to /status only it
    crd: str = ""  # the CustomResourceDefinition serving it ("" for a built-in kind)
    list_kind: str = ""
    schema: dict | None = field(default=None, compare=False, repr=False)  # a custom resource's openAPIV3Schema

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def key(self) -> str:
        """Where its objects are kept: the plural for a built-in kind, plural.group for a custom one."""
        return f"{self.plural}.{self.group}" if self.crd else self.plural

    @property
    def qualified(self) -> str:
        """The resource as the API server names it in messages: pods, jobs.batch, queues.sluice.io."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def unconditional_update(self) -> bool:
        """Whether a PUT may leave out metadata.resourceVersion (not for custom resources and CRDs)."""
        return not self.crd and self.plural != "customresourcedefinitions"


RESOURCES = {r.plural: r for r in (
    Resource("namespaces", "Namespace", "v1", False, "namespace", ("ns",), status=True),
    Resource("nodes", "Node", "v1", False, "node", ("no",), status=True),
    Resource("pods", "Pod", "v1", True, "pod", ("po",), ("all",), status=True),
    Resource("events", "Event", "v1", True, "event", ("ev",)),
    Resource("jobs", "Job", "batch/v1", True, "job", (), ("all",), status=True),
    Resource("customresourcedefinitions", "CustomResourceDefinition", "apiextensions.k8s.io/v1", False,
             "customresourcedefinition", ("crd", "crds"), ("api-extensions",), status=True),
)}
CRDS = RESOURCES["customresourcedefinitions"]


@dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    status: int = 0
    at: float = 0.0  # time.monotonic() when the request arrived
    content_type: str = ""  # the request's Content-Type (which patch format a PATCH used)

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass
class _Fault:
    method: str
    path: re.Pattern
    status: int
    times: int
    retry_after: int | None
    watch: bool | None  # None: any request; True: only watches; False: only non-watch requests


class ApiError(Exception):
    """Answered as a Status object with this code."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return _status(self.code, self.reason, self.message, self.details)


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
           "reason": reason, "code": code}
    if details:
        out["details"] = details
    return out


def _details(resource: Resource, name: str, **more) -> dict:
    out = {"name": name, "group": resource.group, "kind": resource.plural, **more}
    return {k: v for k, v in out.items() if v != ""}


def _not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.qualified} "{name}" not found', _details(resource, name))


def _conflict(resource: Resource, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource.qualified} "{name}": {why}',
                    _details(resource, name))


_STALE = "the object has been modified; please apply your changes to the latest version and try again"
_CAUSES = (("Required value", "FieldValueRequired"), ("Unsupported value", "FieldValueNotSupported"),
           ("Forbidden", "FieldValueForbidden"), ("Duplicate value", "FieldValueDuplicate"),
           ("Too many", "FieldValueTooMany"), ("Too long", "FieldValueTooLong"))


def _cause_reason(message: str) -> str:
    if "in body must be of type" in message:
        return "FieldValueTypeInvalid"
    return next((reason for prefix, reason in _CAUSES if message.startswith(prefix)), "FieldValueInvalid")


def _invalid(resource: Resource, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """The API server's 422 for field errors: `Job.batch "j" is invalid: spec.x: ...` ([a, b] for several)."""
    texts = [f"{f}: {m}" if f else m for f, m in causes]
    text = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = {"name": name, "group": resource.group, "kind": resource.kind,
               "causes": [{"reason": _cause_reason(m), "message": m, "field": f} for f, m in causes]}
    return ApiError(422, "Invalid", f'{resource.qualified_kind} "{name}" is invalid: {text}',
                    {k: v for k, v in details.items() if v != ""})


def _success(resource: Resource, obj: dict) -> dict:
    """What a delete that removed the object at once answers (for kinds that do not return the object)."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": _details(resource, obj["metadata"]["name"], uid=obj["metadata"].get("uid", ""))}


def _now_text(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


_TIME_FIELDS = frozenset({"creationTimestamp", "deletionTimestamp", "lastTransitionTime", "lastProbeTime",
                          "lastHeartbeatTime", "lastUpdateTime", "startTime", "completionTime", "startedAt",
                          "finishedAt", "firstTimestamp", "lastTimestamp"})


def _normalize_times(value: object) -> None:
    """Write the metav1.Time fields of a built-in object as the API server stores them (UTC, whole seconds,
    a Z): clients send other RFC 3339 forms (the Python client's isoformat() has +00:00)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _TIME_FIELDS and isinstance(item, str):
                try:
                    at = datetime.fromisoformat(item)
                except ValueError:
                    continue  # validation says what is wrong with it
                if at.tzinfo is not None:
                    value[key] = _now_text(at.astimezone(UTC))
            else:
                _normalize_times(item)
    elif isinstance(value, list):
        for item in value:
            _normalize_times(item)


def _omit_empty_metadata(metadata: dict) -> None:
    """ObjectMeta's omitempty: empty labels, annotations, finalizers and owner references are not written."""
    for key in ("labels", "annotations", "finalizers", "ownerReferences", "managedFields"):
        if key in metadata and metadata[key] in ({}, [], None):
            del metadata[key]


def _suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


# -- selectors ---------------------------------------------------------------------------------------

def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    requirements = []
    for term in _split_top(text or ""):
        match = re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s+\((.*)\)", term)
        if match:
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append((match.group(1), match.group(2), values))
        elif term.startswith("!"):
            requirements.append((term[1:].strip(), "!exists", ()))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            requirements.append((key.strip(), "!=", (value.strip(),)))
        elif "==" in term:
            key, value = term.split("==", 1)
            requirements.append((key.strip(), "=", (value.strip(),)))
        elif "=" in term:
            key, value = term.split("=", 1)
            requirements.append((key.strip(), "=", (value.strip(),)))
        else:
            requirements.append((term, "exists", ()))
    return requirements


def labels_match(labels: dict, requirements) -> bool:
    for key, op, values in requirements:
        present = key in labels
        value = labels.get(key)
        if op == "=" and value != values[0]:
            return False
        if op == "!=" and value == values[0]:
            return False
        if op == "in" and value not in values:
            return False
        if op == "notin" and present and value in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!exists" and present:
            return False
    return True


def parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    out = []
    for term in _split_top(text or ""):
        if "!=" in term:
            key, value = term.split("!=", 1)
            out.append((key.strip(), "!=", value.strip()))
        else:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            out.append((key.strip(), "=", value.strip()))
    return out


def _field(obj: dict, path: str) -> str:
    value: object = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def fields_match(obj: dict, requirements) -> bool:
    for key, op, value in requirements:
        actual = _field(obj, key)
        if (op == "=") != (actual == value):
            return False
    return True


# -- validation --------------------------------------------------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _label_key_error(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return "prefix part must be a lowercase RFC 1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return "name part must consist of alphanumeric characters, '-', '_' or '.', at most 63"
    return None


def _pod_spec_errors(spec: dict, path: str, *, in_job: bool) -> list[tuple[str, str]]:
    errors = []
    seen = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{i}]"
            name = container.get("name") or ""
            if not name:
                errors.append((f"{where}.name", "Required value"))
            elif len(name) > 63 or not _DNS_LABEL.fullmatch(name):
                errors.append((f"{where}.name", f"Invalid value: {name!r}: a lowercase RFC 1123 label must consist "
                                                "of lower case alphanumeric characters or '-'"))
            elif name in seen:
                errors.append((f"{where}.name", f"Duplicate value: {name!r}"))
            seen.add(name)
            if not container.get("image"):
                errors.append((f"{where}.image", "Required value"))
    if not spec.get("containers"):
        errors.append((f"{path}.containers", "Required value"))
    policy = spec.get("restartPolicy")
    if in_job and policy not in ("Never", "OnFailure"):
        errors.append((f"{path}.restartPolicy", "Required value: valid values: \"OnFailure\", \"Never\""
                       if policy is None else f"Unsupported value: {policy!r}: supported values: "
                                               "\"OnFailure\", \"Never\""))
    elif policy not in (None, "Always", "OnFailure", "Never"):
        errors.append((f"{path}.restartPolicy", f"Unsupported value: {policy!r}"))
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        errors.append((f"{path}.activeDeadlineSeconds", "Invalid value: must be greater than 0"))
    return errors


def _semantic_errors(resource: Resource, obj: dict) -> list[tuple[str, str]]:
    """What the API server's own validation rejects beyond the OpenAPI schema (a useful subset):
    object and container names, label keys and values, required container fields, restart policies,
    and the shape of a Job."""
    errors = []
    metadata = obj.get("metadata") or {}
    name = metadata.get("name") or ""
    if not name:
        errors.append(("metadata.name", "Required value: name or generateName is required"))
    elif resource.key in ("namespaces", "jobs") and (len(name) > 63 or not _DNS_LABEL.fullmatch(name)):
        errors.append(("metadata.name", f"Invalid value: {name!r}: a lowercase RFC 1123 label must consist of "
                                        "lower case alphanumeric characters or '-', at most 63 characters"))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        errors.append(("metadata.name", f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist "
                                        "of lower case alphanumeric characters, '-' or '.'"))

    def check_labels(labels: dict, path: str) -> None:
        for key, value in (labels or {}).items():
            problem = _label_key_error(key)
            if problem:
                errors.append((f"{path}", f"Invalid value: {key!r}: {problem}"))
            if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
                errors.append((f"{path}", f"Invalid value: {value!r}: a valid label value must be 63 characters "
                                          "or less and consist of alphanumeric characters, '-', '_' or '.'"))

    check_labels(metadata.get("labels"), "metadata.labels")
    finalizers = metadata.get("finalizers") or []
    for i, finalizer in enumerate(finalizers):
        problem = _label_key_error(finalizer) if isinstance(finalizer, str) else "must be a string"
        if problem:
            errors.append((f"metadata.finalizers[{i}]", f"Invalid value: {go_value(finalizer)}: {problem}"))
    if "orphan" in finalizers and "foregroundDeletion" in finalizers:
        errors.append(("metadata.finalizers", f"Invalid value: {_go_strings(finalizers)}: finalizers \"orphan\" and "
                                              "\"foregroundDeletion\" cannot be both set"))
    if resource.key == "pods":
        errors += _pod_spec_errors(obj.get("spec") or {}, "spec", in_job=False)
    if resource.key == "jobs":
        spec = obj.get("spec") or {}
        managed_by = spec.get("managedBy")
        if managed_by is not None:
            prefix, _, path = str(managed_by).partition("/")
            if len(managed_by) > 63:
                errors.append(("spec.managedBy", "Too long: may not be more than 63 bytes"))
            elif not path or not _DNS_SUBDOMAIN.fullmatch(prefix):
                errors.append(("spec.managedBy", f"Invalid value: {go_value(managed_by)}: must be a domain-prefixed "
                                                 "path (such as \"acme.io/foo\")"))
        template = spec.get("template") or {}
        check_labels((template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
        errors += _pod_spec_errors(template.get("spec") or {}, "spec.template.spec", in_job=True)
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
            errors.append(("spec.completions", "Required value: when completion mode is Indexed"))
        for key in ("parallelism", "completions", "backoffLimit"):
            if spec.get(key) is not None and spec[key] < 0:
                errors.append((f"spec.{key}", "Invalid value: must be greater than or equal to 0"))
    return errors


def _go_strings(values: list) -> str:
    """A []string as Go's %#v prints it."""
    return "[]string{" + ", ".join(json.dumps(v) for v in values) + "}"


def _immutable(path: str, value: object) -> tuple[str, str]:
    return (path, f"Invalid value: {go_value(value)}: field is immutable")


def _compact(value: object) -> object:
    """A value with nulls and empty maps and lists left out (the API server's semantic equality treats a
    missing map or list as an empty one)."""
    if isinstance(value, dict):
        out = {k: _compact(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def _meta_update_errors(new: dict, old: dict) -> list[tuple[str, str]]:
    """ValidateObjectMetaUpdate: the deletion fields are the server's, and an object being deleted takes no
    new finalizers."""
    errors = []
    meta, old_meta = new["metadata"], old["metadata"]
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        if meta.get(key) != old_meta.get(key):
            errors.append(_immutable(f"metadata.{key}", meta.get(key)))
    if old_meta.get("deletionTimestamp"):
        added = sorted(set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or []))
        if added:
            errors.append(("metadata.finalizers", "Forbidden: no new finalizers can be added if the object is being "
                                                  f"deleted, found new finalizers {_go_strings(added)}"))
    return errors


_SCHEDULING_DIRECTIVES = ("nodeSelector", "tolerations", "schedulingGates")


def _job_update_errors(new: dict, old: dict) -> list[tuple[str, str]]:
    """ValidateJobSpecUpdate (v1.33): what a Job's spec may not change. Its template is immutable, except
    that a suspended Job that never started (no status.startTime) may change the template's labels and
    annotations and its node selector, tolerations, scheduling gates and node affinity
    (JobMutableNodeSchedulingDirectives); completions may change on an Indexed Job in step with parallelism
    (ElasticIndexedJob)."""
    errors = []
    spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    if spec.get("completions") != old_spec.get("completions"):
        if spec.get("completionMode") != "Indexed":
            errors.append(_immutable("spec.completions", spec.get("completions")))
        elif spec.get("completions") is not None and spec.get("completions") != spec.get("parallelism"):
            errors.append(("spec.completions", f"Invalid value: {go_value(spec.get('completions'))}: can only be "
                                               "modified in tandem with spec.parallelism"))
    for key in ("selector", "completionMode", "podFailurePolicy", "backoffLimitPerIndex", "managedBy",
                "successPolicy"):
        if _compact(spec.get(key)) != _compact(old_spec.get(key)):
            errors.append(_immutable(f"spec.{key}", spec.get(key)))
    template = copy.deepcopy(spec.get("template") or {})
    before = copy.deepcopy(old_spec.get("template") or {})
    if old_spec.get("suspend") and not (old.get("status") or {}).get("startTime"):
        meta, old_meta = template.get("metadata") or {}, before.setdefault("metadata", {})
        pod, old_pod = template.get("spec") or {}, before.setdefault("spec", {})
        for key in ("labels", "annotations"):
            old_meta[key] = meta.get(key)
        for key in _SCHEDULING_DIRECTIVES:
            old_pod[key] = pod.get(key)
        affinity, old_affinity = pod.get("affinity"), old_pod.get("affinity")
        if affinity is None and old_affinity is not None:
            rest = {k: v for k, v in old_affinity.items() if k != "nodeAffinity"}
            old_pod["affinity"] = rest or None
        elif affinity is not None and old_affinity is None:
            old_pod["affinity"] = {"nodeAffinity": affinity.get("nodeAffinity")}
        elif affinity is not None:
            old_pod["affinity"] = {**old_affinity, "nodeAffinity": affinity.get("nodeAffinity")}
    if _compact(template) != _compact(before):
        errors.append(_immutable("spec.template", spec.get("template")))
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        errors.append(("spec.template.metadata.labels", f"Invalid value: {go_value(labels)}: `selector` does not "
                                                        "match template `labels`"))
    return errors


def _true_condition(obj: dict, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _job_status_errors(new: dict, old: dict) -> list[tuple[str, str]]:
    """ValidateJobStatusUpdate with the checks JobManagedBy turns on (a useful subset): counters are not
    negative and do not go down, terminal conditions stay, an unsuspended Job keeps its startTime."""
    errors = []
    status, old_status = new.get("status") or {}, old.get("status") or {}
    for key in ("active", "succeeded", "failed", "terminating", "ready"):
        if (status.get(key) or 0) < 0:
            errors.append((f"status.{key}", f"Invalid value: {status[key]}: must be greater than or equal to 0"))
    for kind in ("Failed", "Complete", "FailureTarget"):
        if _true_condition(old, kind) and not _true_condition(new, kind):
            errors.append(("status.conditions", f"Invalid value: cannot disable the terminal {kind}=True condition"))
    if _true_condition(old, "SuccessCriteriaMet") and not _true_condition(new, "SuccessCriteriaMet"):
        errors.append(("status.conditions", "Invalid value: cannot disable the SuccessCriteriaMet=True condition"))
    if (status.get("failed") or 0) < (old_status.get("failed") or 0):
        errors.append(("status.failed", f"Invalid value: {status.get('failed') or 0}: cannot decrease the failed "
                                        "counter"))
    spec = new.get("spec") or {}
    elastic = spec.get("completionMode") == "Indexed" and spec.get("completions") == spec.get("parallelism")
    if not elastic and (status.get("succeeded") or 0) < (old_status.get("succeeded") or 0):
        errors.append(("status.succeeded", f"Invalid value: {status.get('succeeded') or 0}: cannot decrease the "
                                           "succeeded counter"))
    if old_status.get("startTime") and status.get("startTime") != old_status["startTime"] and not spec.get("suspend"):
        errors.append(("status.startTime", "Required value: startTime cannot be removed for unsuspended job"))
    if old_status.get("completionTime") and status.get("completionTime") \
            and status["completionTime"] != old_status["completionTime"]:
        errors.append(("status.completionTime", f"Invalid value: {go_value(status['completionTime'])}: "
                                                "completionTime cannot be mutated"))
    return errors


_POD_UPDATE_MESSAGE = ("Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                       "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
                       "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set "
                       "to 1 if it was previously negative)")


def _pod_update_errors(new: dict, old: dict) -> list[tuple[str, str]]:
    """ValidatePodUpdate, roughly: a pod's spec is immutable but for its images, activeDeadlineSeconds,
    added tolerations and removed scheduling gates."""
    spec, old_spec = copy.deepcopy(new.get("spec") or {}), copy.deepcopy(old.get("spec") or {})
    for one in (spec, old_spec):
        for group in ("containers", "initContainers"):
            for container in one.get(group) or []:
                container.pop("image", None)
        one.pop("activeDeadlineSeconds", None)
    tolerations, old_tolerations = spec.pop("tolerations", None) or [], old_spec.pop("tolerations", None) or []
    gates, old_gates = spec.pop("schedulingGates", None) or [], old_spec.pop("schedulingGates", None) or []
    if _compact(spec) != _compact(old_spec) or any(t not in tolerations for t in old_tolerations):
        return [("spec", _POD_UPDATE_MESSAGE)]
    if any(g not in old_gates for g in gates):
        return [("spec.schedulingGates", "Forbidden: only deletion is allowed, but found new scheduling gate")]
    return []


def _crd_update_errors(new: dict, old: dict) -> list[tuple[str, str]]:
    spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    names, old_names = spec.get("names") or {}, old_spec.get("names") or {}
    errors = []
    for path, value, before in (("spec.group", spec.get("group"), old_spec.get("group")),
                                ("spec.names.plural", names.get("plural"), old_names.get("plural")),
                                ("spec.scope", spec.get("scope"), old_spec.get("scope")),
                                ("spec.names.kind", names.get("kind"), old_names.get("kind"))):
        if value != before:
            errors.append(_immutable(path, value))
    stored = (old.get("status") or {}).get("storedVersions") or []
    served_names = {v.get("name") for v in spec.get("versions") or []}
    for i, version in enumerate(stored):
        if version not in served_names:
            errors.append((f"status.storedVersions[{i}]", f"Invalid value: {go_value(version)}: missing from "
                                                          f"spec.versions; {version} was previously a storage version, "
                                                          f"and must remain in spec.versions until a storage migration "
                                                          f"ensures no data remains persisted in {version} and removes "
                                                          f"{version} from status.storedVersions"))
    return errors


def _kube_version_key(version: str) -> tuple:
    """The API server's version priority: GA before beta before alpha, higher numbers first."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (3, 0, 0, version)
    stability = {None: 0, "beta": 1, "alpha": 2}[match.group(2)]
    return (stability, -int(match.group(1)), -int(match.group(3) or 0), "")


# -- the server --------------------------------------------------------------------------------------

class FakeKube:
    """A fake API server. `start()` binds 127.0.0.1 on a free port; `kubeconfig(path)` writes a
    kubeconfig for it. Thread-safe; every change bumps one global resourceVersion."""

    def __init__(self, *, version: str = KUBERNETES_VERSION, strict: bool = True, pod_termination_s: float = 0.05,
                 history: int = 10_000):
        self.version = version
        self.strict = strict  # unknown fields are an error (the agent must never send any)
        self.pod_termination_s = pod_termination_s
        self.history_limit = history
        self._cond = threading.Condition()
        self._rv = 0
        # objects by store key (plural, or plural.group for a custom resource) and (namespace, name)
        self._objects: dict[str, dict[tuple[str, str], dict]] = {plural: {} for plural in RESOURCES}
        self._served: dict[tuple[str, str], Resource] = {(r.api_version, r.plural): r for r in RESOURCES.values()}
        self._kinds: dict[str, Resource] = dict(RESOURCES)  # store key -> the resource it is stored as
        self._syncing: set[str] = set()  # the Jobs the controller is syncing now (their pods' changes wait)
        # (rv, store key, type, object, the object before: a watch with selectors tells entering from leaving)
        self._history: list[tuple[int, str, str, dict, dict | None]] = []
        self._last: dict[tuple[str, str, str], dict] = {}  # the last recorded state of every object
        self._compacted = 0  # watches from a resourceVersion below this get 410
        self._watch_generation = 0  # bumped by break_watches
        self._faults: list[_Fault] = []
        self._timers: list[tuple[float, int, object]] = []
        self._timer_seq = itertools.count()
        self._autopilot = False
        self._pod_ips = itertools.count()  # the n-th pod to run (from 0) gets 10.244.<n // 250>.<n % 250 + 1>
        self._stopping = False
        self.requests: list[RequestRecord] = []
        self.deletions: list[tuple[str, str, str, str]] = []  # (plural, namespace, name, propagationPolicy)
        self.tokens: set[str] = set()
        self.errors: list[str] = []  # the fake's own failures while answering (each also answered 500)
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._open_sockets: set[socket.socket] = set()
        # (namespace, pod) -> container -> [(when, line)]; a pod's logs go with it
        self._logs: dict[tuple[str, str], dict[str, list[tuple[datetime, str]]]] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> FakeKube:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        def serve():
            self._server.serve_forever(poll_interval=0.05)
        for target, name in ((serve, "fakekube-http"), (self._controller, "fakekube-ctl")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._close_sockets()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_port}"

    def kubeconfig(self, path: pathlib.Path | str, *, context: str = "fake", token: str = "fake-token") -> pathlib.Path:
        """Write a kubeconfig whose context `context` points at this server."""
        path = pathlib.Path(path)
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "fakekube", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [{"name": context, "context": {"cluster": "fakekube", "user": "tester"}}],
        }))
        return path

    # -- fault injection -----------------------------------------------------------------------
    def fail(self, status: int = 429, *, method: str = "*", path: str = ".*", times: int = 1,
             retry_after: int | None = None, watch: bool | None = None) -> None:
        """Answer the next `times` requests matching method and path (a regex, searched) with `status`
        (429 TooManyRequests, 500 InternalError, 503 ServiceUnavailable, ...)."""
        with self._cond:
            self._faults.append(_Fault(method.upper(), re.compile(path), status, times, retry_after, watch))

    def break_watches(self) -> None:
        """Cut every open watch stream (the connection drops, as when an API server restarts)."""
        with self._cond:
            self._watch_generation += 1
            self._cond.notify_all()

    def compact(self) -> int:
        """Forget the event history (etcd compaction): a watch from any resourceVersion before now gets
        410 Gone. Returns the current resourceVersion."""
        with self._cond:
            self._compacted = self._rv + 1
            self._history.clear()
            return self._rv

    def reset_requests(self) -> None:
        with self._cond:
            self.requests.clear()

    def requests_matching(self, method: str, path_regex: str, **query) -> list[RequestRecord]:
        with self._cond:
            return [r for r in self.requests if r.method == method and re.search(path_regex, r.path)
                    and all(r.query.get(k) == v for k, v in query.items())]

    # -- direct access (tests) -----------------------------------------------------------------
    def get(self, plural: str, namespace: str, name: str) -> dict | None:
        """An object as stored (plural: pods, jobs, ..., customresourcedefinitions, or a custom resource's
        plural.group, or its plural alone when no other group uses it)."""
        with self._cond:
            obj = self._objects[self._store(plural)].get((namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, plural: str, namespace: str | None = None, selector: str = "") -> list[dict]:
        requirements = parse_label_selector(selector)
        with self._cond:
            return [copy.deepcopy(o) for (ns, _), o in sorted(self._objects[self._store(plural)].items())
                    if (namespace is None or ns == namespace)
                    and labels_match(o["metadata"].get("labels") or {}, requirements)]

    def put(self, obj: dict) -> dict:
        """Create an object as a cluster admin would (validated like any create): any served kind, a
        CustomResourceDefinition or a custom object of one included."""
        with self._cond:
            resource = self._resource_of(obj)
            return self._present(resource, self._create(resource, obj["metadata"].get("namespace", ""),
                                                        copy.deepcopy(obj)))

    def patch(self, plural: str, namespace: str, name: str, body: object, *, content_type: str = MERGE_PATCH,
              subresource: str | None = None) -> dict:
        """Patch an object as someone else would (kubectl patch; subresource "status" for --subresource=status).
        Raises ApiError with the API server's answer when it refuses."""
        with self._cond:
            resource = self._kinds[self._store(plural)]
            return self._present(resource, self._patch(resource, namespace or "", name, content_type,
                                                       json.dumps(body).encode(), status=subresource == "status"))

    def events(self, plural: str, since: int | str = 0) -> list[tuple[str, dict]]:
        """The watch events (type, object) of a resource after resourceVersion `since`, as a watch from it would
        deliver them (while the history holds them)."""
        with self._cond:
            key = self._store(plural)
            return [(kind, copy.deepcopy(obj)) for rv, store, kind, obj, _ in self._history
                    if store == key and rv > int(since or 0)]

    def delete(self, plural: str, namespace: str, name: str, propagation: str = "Background") -> None:
        """Delete an object as someone else would (kubectl delete)."""
        with self._cond:
            self._delete(self._kinds[self._store(plural)], namespace, name, propagation, None)

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def add_namespace(self, name: str) -> None:
        self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def add_node(self, name: str, allocatable: dict[str, str], *, ready: bool = True,
                 unschedulable: bool = False) -> None:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {"unschedulable": True} if unschedulable else {},
                "status": {"allocatable": dict(allocatable), "capacity": dict(allocatable),
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                           "reason": "KubeletReady" if ready else "KubeletNotReady"}]}}
        self.put(node)

    def set_node(self, name: str, *, ready: bool | None = None, unschedulable: bool | None = None) -> None:
        with self._cond:
            node = self._objects["nodes"][("", name)]
            if unschedulable is not None:
                node["spec"]["unschedulable"] = unschedulable
            if ready is not None:
                node["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
            self._modified("nodes", node)

    # -- acting as scheduler and kubelet -------------------------------------------------------
    def schedule(self, namespace: str, name: str, node: str) -> None:
        with self._cond:
            pod = self._pod(namespace, name)
            pod["spec"]["nodeName"] = node
            self._set_condition(pod, "PodScheduled", "True")
            self._modified("pods", pod)

    def unschedulable(self, namespace: str, name: str,
                      message: str = "0/1 nodes are available: 1 Insufficient cpu.") -> None:
        with self._cond:
            pod = self._pod(namespace, name)
            self._set_condition(pod, "PodScheduled", "False", reason="Unschedulable", message=message)
            self._modified("pods", pod)

    def run_pod(self, namespace: str, name: str, node: str | None = None, *, at: datetime | None = None) -> None:
        """The pod's containers start; at: the kubelet's time for it (default now)."""
        with self._cond:
            self._run(self._pod(namespace, name), node, at)

    def set_pod_ip(self, namespace: str, name: str, ip: str) -> None:
        """The kubelet reports another IP for the pod ("" for none)."""
        with self._cond:
            pod = self._pod(namespace, name)
            pod["status"]["podIP"] = ip
            pod["status"]["podIPs"] = [{"ip": ip}] if ip else []
            self._modified("pods", pod)

    def succeed_pod(self, namespace: str, name: str, *, at: datetime | None = None) -> None:
        with self._cond:
            self._end(self._pod(namespace, name), 0, at=at)

    def fail_pod(self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error", message: str = "",
                 pod_reason: str | None = None, *, at: datetime | None = None) -> None:
        """The pod's container terminates with exit_code (reason, e.g. Error or OOMKilled); pod_reason sets
        the pod's own status.reason (DeadlineExceeded, Evicted) instead."""
        with self._cond:
            self._end(self._pod(namespace, name), exit_code, reason=reason, message=message, pod_reason=pod_reason,
                      at=at)

    def image_pull_error(self, namespace: str, name: str, reason: str = "ErrImagePull",
                         message: str = 'failed to pull image "nope:1": not found') -> None:
        with self._cond:
            pod = self._pod(namespace, name)
            pod["spec"].setdefault("nodeName", self._any_node())
            self._set_condition(pod, "PodScheduled", "True")
            pod["status"]["containerStatuses"] = [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"waiting": {"reason": reason, "message": message}}}
                for c in pod["spec"]["containers"]]
            self._modified("pods", pod)

    def crash_loop(self, namespace: str, name: str, restarts: int, exit_code: int = 1, reason: str = "Error") -> None:
        """A restartPolicy OnFailure container that keeps failing: waiting in CrashLoopBackOff."""
        with self._cond:
            pod = self._pod(namespace, name)
            pod["spec"].setdefault("nodeName", self._any_node())
            pod["status"]["phase"] = "Running"
            pod["status"]["containerStatuses"] = [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                 "restartCount": restarts,
                 "state": {"waiting": {"reason": "CrashLoopBackOff",
                                       "message": "back-off restarting failed container"}},
                 "lastState": {"terminated": {"exitCode": exit_code, "reason": reason}}}
                for c in pod["spec"]["containers"]]
            self._modified("pods", pod)

    def fail_job(self, namespace: str, name: str, reason: str = "DeadlineExceeded",
                 message: str = "Job was active longer than specified deadline") -> None:
        with self._cond:
            job = self._objects["jobs"][(namespace, name)]
            self._job_fails(job, reason, message)

    def append_log(self, namespace: str, name: str, text: str, container: str | None = None) -> None:
        """The container (default: the pod's first) writes `text`, one log line per line of it."""
        with self._cond:
            pod = self._pod(namespace, name)
            container = container or pod["spec"]["containers"][0]["name"]
            if container not in _container_names(pod):
                raise KeyError(f"pod {namespace}/{name} has no container {container}")
            self._write_log(pod, container, text)

    def log_lines(self, namespace: str, name: str, container: str | None = None) -> list[str]:
        """What the container (default: the pod's first) has logged so far."""
        with self._cond:
            pod = self._pod(namespace, name)
            container = container or pod["spec"]["containers"][0]["name"]
            return [line for _, line in self._logs.get((namespace, name), {}).get(container, [])]

    def autopilot(self, on: bool = True) -> None:
        """Act as scheduler and kubelet: bind, run and end pods by themselves (see the module docstring)."""
        with self._cond:
            self._autopilot = on
            self._cond.notify_all()

    # -- internals: kinds and routes -----------------------------------------------------------
    def _store(self, name: str) -> str:
        """The store key a test names: a built-in plural, plural.group, or a custom plural no other group uses."""
        if name in self._objects:
            return name
        keys = {r.key for r in self._kinds.values() if r.crd and r.plural == name}
        if len(keys) == 1:
            return keys.pop()
        raise KeyError(f"no resource {name!r} here (a custom resource is named plural.group)")

    def _resource_of(self, obj: dict) -> Resource:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        for resource in self._served.values():
            if resource.kind == kind and api_version in (None, resource.api_version):
                return resource
        for resource in RESOURCES.values():  # a wrong apiVersion: the create answers 400
            if resource.kind == kind:
                return resource
        raise KeyError(f"no kind {api_version}/{kind} is served")

    @staticmethod
    def _present(resource: Resource, obj: dict) -> dict:
        """A copy of a stored object as served at the resource's version (custom objects are kept at their
        storage version and served at every served version, with conversion strategy None)."""
        out = copy.deepcopy(obj)
        if resource.crd:
            out["apiVersion"] = resource.api_version
        return out

    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str | None]:
        """(resource, namespace or None, name or None, subresource or None) for an API path."""
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group_version, rest = parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and (group_version, rest[2]) in self._served:
            namespace, rest = rest[1], rest[2:]
        resource = self._served.get((group_version, rest[0])) if rest else None
        if resource is None or len(rest) > 3 or (namespace is not None and not resource.namespaced) \
                or (namespace is None and resource.namespaced and len(rest) > 1):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return resource, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None

    def _discovery(self, path: str) -> dict | None:
        """The discovery documents (/version, /api, /api/v1, /apis, /apis/GROUP, /apis/GROUP/VERSION), or None
        for any other path."""
        parts = [p for p in path.split("/") if p]
        if parts == ["version"]:
            major, minor = self.version.split(".")[:2]
            return {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0", "gitCommit": "fakekube",
                    "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                    "compiler": "gc", "platform": "linux/amd64"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url.removeprefix("http://")}]}
        groups: dict[str, list[str]] = {}
        for resource in self._served.values():
            if resource.group:
                versions = groups.setdefault(resource.group, [])
                if resource.version not in versions:
                    versions.append(resource.version)

        def group_document(name: str) -> dict:
            versions = sorted(groups[name], key=_kube_version_key)
            listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
            return {"name": name, "versions": listed, "preferredVersion": listed[0]}
        if parts == ["apis"]:
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_document(g) for g in groups]}
        if len(parts) == 2 and parts[0] == "apis":
            if parts[1] not in groups:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return {"kind": "APIGroup", "apiVersion": "v1", **group_document(parts[1])}
        if parts == ["api", "v1"] or (len(parts) == 3 and parts[0] == "apis"):
            group_version = "v1" if parts[0] == "api" else f"{parts[1]}/{parts[2]}"
            resources = [r for r in self._served.values() if r.api_version == group_version]
            if not resources:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            listed = []
            for r in resources:
                entry = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                         "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}
                if r.short_names:
                    entry["shortNames"] = list(r.short_names)
                if r.categories:
                    entry["categories"] = list(r.categories)
                listed.append(entry)
                if r.status:
                    listed.append({"name": f"{r.plural}/status", "singularName": "", "namespaced": r.namespaced,
                                   "kind": r.kind, "verbs": ["get", "patch", "update"]})
                if r.key == "pods":
                    listed.append({"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod",
                                   "verbs": ["get"]})
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                    "resources": listed}
        return None

    # -- internals: store ----------------------------------------------------------------------
    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _record(self, plural: str, kind: str, obj: dict) -> None:
        recorded = copy.deepcopy(obj)
        identity = (plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        before = self._last.pop(identity, None) if kind == "DELETED" else self._last.get(identity)
        if kind != "DELETED":
            self._last[identity] = recorded
        self._history.append((int(obj["metadata"]["resourceVersion"]), plural, kind, recorded, before))
        if len(self._history) > self.history_limit:
            dropped = self._history[: len(self._history) - self.history_limit]
            del self._history[: len(dropped)]
            self._compacted = dropped[-1][0] + 1
        self._cond.notify_all()

    def _modified(self, plural: str, obj: dict) -> None:
        obj["metadata"]["resourceVersion"] = self._bump()
        self._record(plural, "MODIFIED", obj)
        if plural == "pods":
            self._pod_changed(obj)

    @staticmethod
    def _key(resource: Resource, obj: dict) -> tuple[str, str]:
        return (obj["metadata"].get("namespace", "") if resource.namespaced else "", obj["metadata"]["name"])

    def _crd_object(self, resource: Resource) -> dict | None:
        return self._objects["customresourcedefinitions"].get(("", resource.crd)) if resource.crd else None

    def _create(self, resource: Resource, namespace: str, obj: dict, query: dict | None = None,
                warnings: list[str] | None = None, *, dry_run: bool = False) -> dict:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format: not an object")
        metadata = obj.get("metadata")
        if not isinstance(metadata, dict):
            metadata = obj["metadata"] = {}
        if resource.namespaced:
            if metadata.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
            metadata["namespace"] = namespace
            if ("", namespace) not in self._objects["namespaces"]:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
        else:
            metadata.pop("namespace", None)
        if metadata.get("resourceVersion"):
            raise ApiError(400, "BadRequest", "resourceVersion should not be set on objects to be created")
        crd = self._crd_object(resource)
        if crd is not None and crd["metadata"].get("deletionTimestamp"):
            raise ApiError(405, "MethodNotAllowed", "create not allowed while custom resource definition is "
                                                    "terminating", _details(resource, metadata.get("name", "")))
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + _suffix()
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                    "selfLink", "managedFields"):
            metadata.pop(key, None)
        _omit_empty_metadata(metadata)
        if resource.crd:
            self._type_meta(resource, obj)
            if resource.status:
                obj.pop("status", None)  # a create cannot set status
            self._prune(resource, obj, query or {}, warnings)
        elif resource is CRDS:
            obj.pop("status", None)
            crdschema.crd_defaults(obj)
        if not resource.crd:
            _normalize_times(obj)
        self._validate(resource, obj)
        key = (namespace if resource.namespaced else "", metadata["name"])
        if key in self._objects[resource.key]:
            raise ApiError(409, "AlreadyExists", f'{resource.qualified} "{metadata["name"]}" already exists',
                           _details(resource, metadata["name"]))
        obj["apiVersion"], obj["kind"] = self._kinds[resource.key].api_version, resource.kind
        metadata["uid"] = f"uid-{next(self._timer_seq)}-{_suffix()}"
        metadata["creationTimestamp"] = _now_text()
        if resource.key == "jobs" or resource.crd or resource is CRDS:
            metadata["generation"] = 1
        if dry_run:  # validated and defaulted, not stored (no resourceVersion, no event, no controller)
            if resource is not CRDS:
                self._defaults(resource, obj)
            return obj
        metadata["resourceVersion"] = self._bump()
        self._defaults(resource, obj)
        self._objects[resource.key][key] = obj
        self._record(resource.key, "ADDED", obj)
        if resource.key == "jobs":
            self._job_sync(obj)
        if resource.key == "pods" and self._autopilot:
            self._cond.notify_all()
        return obj

    @staticmethod
    def _type_meta(resource: Resource, obj: dict) -> None:
        if obj.get("apiVersion") != resource.api_version or obj.get("kind") != resource.kind:
            raise ApiError(400, "BadRequest", f"the API version in the data ({obj.get('apiVersion')}) and kind "
                                              f"({obj.get('kind')}) do not match {resource.api_version} "
                                              f"{resource.kind}")

    @staticmethod
    def _prune(resource: Resource, obj: dict, query: dict, warnings: list[str] | None) -> None:
        """A custom object's unknown fields are dropped (fieldValidation Ignore), dropped with a warning (Warn,
        the default) or refused (Strict); then nulls go and defaults come, as the API server decodes it."""
        dropped = crdschema.prune(obj, resource.schema or {})
        mode = query.get("fieldValidation") or "Warn"
        if dropped and mode == "Strict":
            fields = ", ".join(f'unknown field "{path}"' for path in dropped)
            raise ApiError(400, "BadRequest", f'{resource.kind} in version "{resource.version}" cannot be handled '
                                              f"as a {resource.kind}: strict decoding error: {fields}")
        if dropped and mode != "Ignore" and warnings is not None:
            warnings.extend(f'unknown field "{path}"' for path in dropped)
        crdschema.default(obj, resource.schema or {})

    def _validation_errors(self, resource: Resource, obj: dict) -> list[tuple[str, str]]:
        causes = []
        if not resource.crd:
            try:
                kubernetes_validate.validate(obj, self.version, strict=self.strict)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in exc.path).replace(".[", "[")
                causes.append((path or "<root>", f"Invalid value: {exc.message}"))
        try:
            causes += _semantic_errors(resource, obj)
            if resource.crd:
                causes += crdschema.validate(obj, resource.schema or {})
            if resource is CRDS and not causes:  # its own checks read a CRD the schema accepted
                causes += crdschema.crd_errors(obj)
        except (AttributeError, TypeError, KeyError):
            if not causes:
                causes.append(("<root>", "Invalid value: the object does not have the shape of its kind"))
        return causes

    def _validate(self, resource: Resource, obj: dict) -> None:
        candidate = {**obj, "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind")}
        name = (obj.get("metadata") or {}).get("name", "")
        self._type_meta(resource, candidate)
        causes = self._validation_errors(resource, candidate)
        if causes:
            raise _invalid(resource, name, causes)

    def _defaults(self, resource: Resource, obj: dict) -> None:
        if resource.key == "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        elif resource.key == "pods":
            spec = obj["spec"]
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("serviceAccountName", "default")
            obj["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        elif resource.key == "jobs":
            spec = obj["spec"]
            spec.setdefault("parallelism", 1)
            if spec.get("completions") is None and spec.get("completionMode") != "Indexed":
                spec["completions"] = spec["parallelism"]
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            uid = obj["metadata"]["uid"]
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            template_labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
            template_labels.update({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                                    "batch.kubernetes.io/job-name": obj["metadata"]["name"],
                                    "job-name": obj["metadata"]["name"]})
            obj["status"] = {}
        elif resource is CRDS:
            self._crd_register(obj)

    # -- internals: updates, patches -----------------------------------------------------------
    def _update(self, resource: Resource, namespace: str, name: str, body: object, *, status: bool = False,
                query: dict | None = None, warnings: list[str] | None = None, dry_run: bool = False) -> dict:
        """A PUT of the object (status: of its /status), as the API server's update does it: preconditions
        (resourceVersion, uid), the strategy's reset fields (a write to the object keeps its status, a write to
        /status keeps the rest), generation, validation (as a create, then what an update may not change), no
        write when nothing changed, and the deletion of an object being deleted whose last finalizer goes."""
        store = self._objects[resource.key]
        key = (namespace if resource.namespaced else "", name)
        old = store.get(key)
        if old is None:
            raise _not_found(resource, name)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format: not an object")
        new = copy.deepcopy(body)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = new["metadata"] = {}
        old_meta = old["metadata"]
        if meta.get("name") != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name') or ''}) does not match the "
                                              f"name on the URL ({name})")
        if resource.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        self._type_meta(resource, new)
        version = meta.get("resourceVersion") or ""
        if version and version != old_meta["resourceVersion"]:
            raise _conflict(resource, name, _STALE)
        if not version and not resource.unconditional_update:
            raise _invalid(resource, name, [("metadata.resourceVersion",
                                             "Invalid value: 0x0: must be specified for an update")])
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {meta['uid']}, UID in "
                                            f"object meta: {old_meta['uid']}", _details(resource, name))
        for field_name in ("uid", "creationTimestamp", "resourceVersion", "selfLink"):
            if field_name in old_meta:
                meta[field_name] = old_meta[field_name]
        if old_meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = old_meta["deletionTimestamp"]
            if meta.get("deletionGracePeriodSeconds") is None and "deletionGracePeriodSeconds" in old_meta:
                meta["deletionGracePeriodSeconds"] = old_meta["deletionGracePeriodSeconds"]
        if "generation" in old_meta:
            meta["generation"] = old_meta["generation"]
        else:
            meta.pop("generation", None)
        meta.pop("managedFields", None)
        _omit_empty_metadata(meta)
        new["apiVersion"] = old["apiVersion"]
        if status:
            if resource.crd:  # only .status changes through /status of a custom object
                kept = copy.deepcopy(old)
                if "status" in new:
                    kept["status"] = new["status"]
                else:
                    kept.pop("status", None)
                new = kept
            else:  # a built-in kind's /status keeps the spec (its metadata changes are kept, as the API server does)
                if "spec" in old:
                    new["spec"] = copy.deepcopy(old["spec"])
                else:
                    new.pop("spec", None)
        elif resource.status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        if resource.crd:
            self._prune(resource, new, query or {}, warnings)
        else:
            _normalize_times(new)
        if not status:
            if resource.crd:
                changed = {k: v for k, v in new.items() if k != "metadata"} != \
                    {k: v for k, v in old.items() if k != "metadata"}
            else:
                changed = (resource.key == "jobs" or resource is CRDS) \
                    and _compact(new.get("spec")) != _compact(old.get("spec"))
            if changed and "generation" in old_meta:
                meta["generation"] = old_meta["generation"] + 1
        causes = self._validation_errors(resource, {**new, "apiVersion": resource.api_version})
        try:
            causes += _meta_update_errors(new, old)
            if resource.key == "jobs":
                causes += _job_status_errors(new, old) if status else _job_update_errors(new, old)
            elif resource.key == "pods" and not status:
                causes += _pod_update_errors(new, old)
            elif resource is CRDS and not status:
                causes += _crd_update_errors(new, old)
        except (AttributeError, TypeError, KeyError):
            if not causes:  # a shape the schema let through but the update checks cannot read
                causes.append(("<root>", "Invalid value: the object does not have the shape of its kind"))
        if causes:
            raise _invalid(resource, name, causes)
        if new == old or (not resource.crd and _compact(new) == _compact(old)):
            return old  # nothing changed (as a built-in kind is serialized): no write, no event, the same version
        if dry_run:
            return new
        old.clear()
        old.update(new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") \
                and meta.get("deletionGracePeriodSeconds") in (None, 0):
            self._remove(resource.key, key)  # its last finalizer went: the object goes
            return old
        self._modified(resource.key, old)
        if resource.key == "jobs":
            self._job_sync(old)
        elif resource is CRDS:
            self._crd_register(old)
        return old

    def _patch(self, resource: Resource, namespace: str, name: str, content_type: str, raw: bytes, *,
               status: bool = False, query: dict | None = None, warnings: list[str] | None = None,
               dry_run: bool = False) -> dict:
        """A PATCH: the patch applied to the object as served, then written as an update. A
        metadata.resourceVersion in the patch is a precondition."""
        kind = content_type.split(";")[0].strip().lower()
        accepted = [JSON_PATCH, MERGE_PATCH] + ([] if resource.crd else [STRATEGIC_MERGE_PATCH])
        if kind not in accepted:
            listed = ", ".join(accepted)
            reason = " (server-side apply is not implemented here)" if kind in APPLY_PATCH_TYPES else ""
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                                                        f"accepted media types include: {listed}{reason}")
        old = self._objects[resource.key].get((namespace if resource.namespaced else "", name))
        if old is None:
            raise _not_found(resource, name)
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from None
        current = self._present(resource, old)
        try:
            if kind == JSON_PATCH:
                patched = json_patch(current, body)
            elif kind == MERGE_PATCH:
                if not isinstance(body, dict):
                    raise PatchError(400, "the body of the request was in an unknown format: a merge patch must "
                                          "be a JSON object")
                patched = merge_patch(current, body)
            else:
                patched = strategic_merge_patch(current, body, merge_lists=resource is not CRDS)
        except PatchError as exc:
            if exc.code == 422:
                raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                               {"causes": [{"message": exc.message}]}) from None
            raise ApiError(exc.code, "BadRequest", exc.message) from None
        if not isinstance(patched, dict):
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                           {"causes": [{"message": "the patched document is not an object"}]})
        meta = patched.get("metadata")
        if isinstance(meta, dict) and not meta.get("resourceVersion"):
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]  # no precondition: the current version
        return self._update(resource, namespace, name, patched, status=status, query=query, warnings=warnings,
                            dry_run=dry_run)

    # -- internals: deletion -------------------------------------------------------------------
    def _remove(self, plural: str, key: tuple[str, str]) -> None:
        obj = self._objects.get(plural, {}).pop(key, None)
        if obj is None:
            return
        if plural == "pods":
            self._logs.pop(key, None)
        obj["metadata"]["resourceVersion"] = self._bump()
        self._record(plural, "DELETED", obj)
        if plural == "pods":
            self._owner_pod_gone(obj)
        elif plural == "jobs":
            for pod in self._owned_pods(obj):  # the garbage collector: dependents go after their owner
                self._delete_pod(pod, None)
        elif plural == "namespaces":
            for other, resource in list(self._kinds.items()):
                if resource.namespaced:
                    for okey in [k for k in self._objects.get(other, {}) if k[0] == key[1]]:
                        self._remove(other, okey)
        elif plural == "customresourcedefinitions":
            self._crd_unregister(obj)
        else:
            crd = self._crd_object(self._kinds.get(plural) or CRDS)
            if crd is not None and crd["metadata"].get("deletionTimestamp"):
                self._crd_cleanup(crd)

    def _finalize(self, resource: Resource, obj: dict) -> None:
        """Delete an object now, or while finalizers hold it, mark it as being deleted."""
        if obj["metadata"].get("finalizers"):
            self._mark_deleting(resource, obj)
        else:
            self._remove(resource.key, self._key(resource, obj))

    def _mark_deleting(self, resource: Resource, obj: dict) -> None:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") == 0:
            return
        if not meta.get("deletionTimestamp") and meta.get("generation"):
            meta["generation"] += 1
        meta.setdefault("deletionTimestamp", _now_text())
        meta["deletionGracePeriodSeconds"] = 0
        self._modified(resource.key, obj)

    def _delete(self, resource: Resource, namespace: str, name: str, propagation: str, grace: int | None,
                preconditions: dict | None = None, *, dry_run: bool = False) -> dict:
        key = (namespace if resource.namespaced else "", name)
        obj = self._objects[resource.key].get(key)
        if obj is None:
            raise _not_found(resource, name)
        preconditions = preconditions or {}
        if preconditions.get("uid") and preconditions["uid"] != obj["metadata"]["uid"]:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {preconditions['uid']}, UID "
                                            f"in object meta: {obj['metadata']['uid']}", _details(resource, name))
        wanted = preconditions.get("resourceVersion")
        if wanted and wanted != obj["metadata"]["resourceVersion"]:
            raise _conflict(resource, name, f"the ResourceVersion in the precondition ({wanted}) does not match the "
                                            f"ResourceVersion in record ({obj['metadata']['resourceVersion']}). The "
                                            "object might have been modified")
        if dry_run:
            return self._present(resource, obj)
        self.deletions.append((resource.key, key[0], name, propagation))
        if resource.key == "pods":
            self._delete_pod(obj, grace)
        elif resource.key == "jobs":
            self._delete_job(obj, propagation)
        elif resource is CRDS:
            self._delete_crd(obj)
        elif not obj["metadata"].get("deletionTimestamp"):
            self._finalize(resource, obj)
        if self._objects.get(resource.key, {}).get(key) is obj or resource.key in ("pods", "namespaces") \
                or resource is CRDS:
            return self._present(resource, obj)  # still there (finalizers, graceful), or a kind that returns it
        return _success(resource, obj)

    def _delete_collection(self, resource: Resource, namespace: str | None, query: dict, propagation: str,
                           grace: int | None, *, dry_run: bool = False) -> list[dict]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))
        doomed = [o for (ns, _), o in sorted(self._objects[resource.key].items())
                  if (namespace is None or ns == namespace) and fields_match(o, fields)
                  and labels_match(o["metadata"].get("labels") or {}, labels)]
        out = []
        for obj in doomed:
            out.append(self._present(resource, obj))
            if not dry_run:
                self._delete(resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"], propagation,
                             grace)
        return out

    def _delete_pod(self, pod: dict, grace: int | None) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        running_on_node = pod["spec"].get("nodeName") and pod["status"].get("phase") in ("Pending", "Running")
        if not running_on_node or grace == 0 or self.pod_termination_s <= 0:
            if pod["metadata"].get("finalizers"):
                self._mark_deleting(RESOURCES["pods"], pod)
            else:
                self._remove("pods", key)
            return
        if pod["metadata"].get("deletionTimestamp"):
            return
        pod["metadata"]["deletionTimestamp"] = _now_text()
        pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
        self._modified("pods", pod)
        self._later(self.pod_termination_s, ("remove-pod", key))

    def _delete_job(self, job: dict, propagation: str) -> None:
        pods = self._owned_pods(job)
        meta = job["metadata"]
        if propagation == "Orphan":
            for pod in pods:
                pod["metadata"].pop("ownerReferences", None)
                self._modified("pods", pod)
            self._finalize(RESOURCES["jobs"], job)
        elif propagation == "Foreground" and pods:
            if not meta.get("deletionTimestamp") and meta.get("generation"):
                meta["generation"] += 1
            meta.setdefault("deletionTimestamp", _now_text())
            meta["deletionGracePeriodSeconds"] = 0
            finalizers = meta.setdefault("finalizers", [])
            if "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            self._modified("jobs", job)
            for pod in pods:
                self._delete_pod(pod, None)
        elif not meta.get("deletionTimestamp"):
            # Background: the owner goes now (or once its finalizers are gone), the garbage collector takes its
            # pods after it
            self._finalize(RESOURCES["jobs"], job)

    def _owned_pods(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        return [p for p in self._objects["pods"].values()
                if any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences") or [])]

    def _owner_pod_gone(self, pod: dict) -> None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            job = next((j for j in self._objects["jobs"].values() if j["metadata"]["uid"] == ref.get("uid")), None)
            if job is None:
                continue
            finalizers = job["metadata"].get("finalizers") or []
            if "foregroundDeletion" in finalizers and not self._owned_pods(job):
                finalizers.remove("foregroundDeletion")  # the garbage collector is done with its dependents
                if not finalizers:
                    job["metadata"].pop("finalizers")
                    self._remove("jobs", (job["metadata"]["namespace"], job["metadata"]["name"]))
                else:
                    self._modified("jobs", job)
            elif not job["metadata"].get("deletionTimestamp"):
                self._job_sync(job)

    # -- internals: CustomResourceDefinitions --------------------------------------------------
    def _crd_register(self, crd: dict) -> None:
        """Serve a CRD's served versions (again, after a change), and set its status as the API server's
        controllers do: names accepted, established, stored versions."""
        spec, name = crd["spec"], crd["metadata"]["name"]
        names, group = spec["names"], spec["group"]
        storage = next(v["name"] for v in spec["versions"] if v.get("storage"))
        for served_key, resource in list(self._served.items()):
            if resource.crd == name:
                del self._served[served_key]

        def resource_of(version: dict) -> Resource:
            return Resource(names["plural"], names["kind"], f"{group}/{version['name']}",
                            spec["scope"] == "Namespaced", names.get("singular", ""),
                            tuple(names.get("shortNames") or ()), tuple(names.get("categories") or ()),
                            status="status" in (version.get("subresources") or {}), crd=name,
                            list_kind=names.get("listKind", ""),
                            schema=(version.get("schema") or {}).get("openAPIV3Schema") or {})
        for version in spec["versions"]:
            resource = resource_of(version)
            if version.get("served") and (resource.api_version, resource.plural) not in self._served:
                self._served[(resource.api_version, resource.plural)] = resource
            if version["name"] == storage:
                self._kinds[resource.key] = resource
                self._objects.setdefault(resource.key, {})
        status = crd.setdefault("status", {})
        accepted = {k: v for k, v in names.items() if k in ("plural", "singular", "shortNames", "kind", "listKind",
                                                             "categories")}
        before = copy.deepcopy(status)
        status["acceptedNames"] = accepted
        stored = status.setdefault("storedVersions", [])
        if storage not in stored:
            stored.append(storage)
        conditions = status.setdefault("conditions", [])
        for kind, reason, message in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                      ("Established", "InitialNamesAccepted", "the initial names have been accepted")):
            if not any(c.get("type") == kind for c in conditions):
                conditions.append({"type": kind, "status": "True", "lastTransitionTime": _now_text(),
                                   "reason": reason, "message": message})
        if status != before and crd["metadata"].get("resourceVersion") and \
                self._objects["customresourcedefinitions"].get(("", name)) is crd:
            self._modified("customresourcedefinitions", crd)
        self._cond.notify_all()

    def _crd_unregister(self, crd: dict) -> None:
        name = crd["metadata"]["name"]
        keys = {r.key for r in self._served.values() if r.crd == name} | \
            {k for k, r in self._kinds.items() if r.crd == name}
        for served_key, resource in list(self._served.items()):
            if resource.crd == name:
                del self._served[served_key]
        for key in keys:
            self._kinds.pop(key, None)
            self._objects.pop(key, None)
        self._cond.notify_all()  # the watches of its resources end

    def _set_crd_condition(self, crd: dict, kind: str, status: str, reason: str, message: str) -> None:
        conditions = crd.setdefault("status", {}).setdefault("conditions", [])
        for condition in conditions:
            if condition.get("type") == kind:
                if (condition.get("status"), condition.get("reason"), condition.get("message")) != \
                        (status, reason, message):
                    if condition.get("status") != status:
                        condition["lastTransitionTime"] = _now_text()
                    condition.update(status=status, reason=reason, message=message)
                return
        conditions.append({"type": kind, "status": status, "lastTransitionTime": _now_text(), "reason": reason,
                           "message": message})

    def _delete_crd(self, crd: dict) -> None:
        """A CRD's deletion: it is marked (with the cleanup finalizer), every custom object of it is deleted,
        and it goes once none is left (custom objects with finalizers keep it Terminating)."""
        meta = crd["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = _now_text()
            finalizers = meta.setdefault("finalizers", [])
            if CRD_CLEANUP_FINALIZER not in finalizers:
                finalizers.append(CRD_CLEANUP_FINALIZER)
            self._set_crd_condition(crd, "Terminating", "True", "InstanceDeletionInProgress",
                                    "CustomResource deletion is in progress")
            self._modified("customresourcedefinitions", crd)
        resource = next((r for r in self._kinds.values() if r.crd == meta["name"]), None)
        if resource is not None:
            for obj in list(self._objects.get(resource.key, {}).values()):
                if not obj["metadata"].get("deletionTimestamp"):
                    self._finalize(resource, obj)
        self._crd_cleanup(crd)

    def _crd_cleanup(self, crd: dict) -> None:
        """The CRD finalizer's check: when no custom object of a terminating CRD is left, its cleanup finalizer
        goes (and with it the CRD, unless other finalizers hold it)."""
        meta = crd["metadata"]
        if CRD_CLEANUP_FINALIZER not in (meta.get("finalizers") or []):
            return
        resource = next((r for r in self._kinds.values() if r.crd == meta["name"]), None)
        left = len(self._objects.get(resource.key, {})) if resource is not None else 0
        if left:
            self._set_crd_condition(crd, "Terminating", "True", "InstanceDeletionCheck",
                                    f"could not confirm zero CustomResources remaining: {left} remaining")
            self._modified("customresourcedefinitions", crd)
            return
        meta["finalizers"].remove(CRD_CLEANUP_FINALIZER)
        if not meta["finalizers"]:
            meta.pop("finalizers")
            self._remove("customresourcedefinitions", ("", meta["name"]))
        else:
            self._set_crd_condition(crd, "Terminating", "True", "InstanceDeletionCompleted",
                                    "removed all instances")
            self._modified("customresourcedefinitions", crd)

    # -- internals: pods and the job controller ------------------------------------------------
    def _pod(self, namespace: str, name: str) -> dict:
        try:
            return self._objects["pods"][(namespace, name)]
        except KeyError:
            raise KeyError(f"no pod {namespace}/{name}") from None

    def _any_node(self) -> str:
        return next(iter(sorted(k[1] for k in self._objects["nodes"])), "node-0")

    @staticmethod
    def _set_condition(pod: dict, kind: str, status: str, reason: str = "", message: str = "") -> None:
        conditions = [c for c in pod["status"].get("conditions") or [] if c["type"] != kind]
        condition = {"type": kind, "status": status, "lastTransitionTime": _now_text()}
        if reason:
            condition["reason"] = reason
        if message:
            condition["message"] = message
        pod["status"]["conditions"] = conditions + [condition]

    def _write_log(self, pod: dict, container: str, text: str) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        now = datetime.now(UTC)
        lines = text[:-1] if text.endswith("\n") else text
        self._logs.setdefault(key, {}).setdefault(container, []).extend((now, line) for line in lines.split("\n"))
        self._cond.notify_all()

    def _run(self, pod: dict, node: str | None, at: datetime | None = None) -> None:
        if pod["status"].get("phase") != "Running":
            for container in pod["spec"]["containers"]:
                self._write_log(pod, container["name"], "started")
        pod["spec"]["nodeName"] = node or pod["spec"].get("nodeName") or self._any_node()
        self._set_condition(pod, "PodScheduled", "True")
        self._set_condition(pod, "Ready", "True")
        pod["status"]["phase"] = "Running"
        pod["status"]["startTime"] = pod["status"].get("startTime") or _now_text(at)
        if not pod["status"].get("podIP"):
            n = next(self._pod_ips)
            pod["status"]["podIP"] = f"10.244.{n // 250}.{n % 250 + 1}"
            pod["status"]["podIPs"] = [{"ip": pod["status"]["podIP"]}]
        pod["status"]["containerStatuses"] = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
             "started": True, "state": {"running": {"startedAt": _now_text(at)}}}
            for c in pod["spec"]["containers"]]
        self._modified("pods", pod)

    def _end(self, pod: dict, exit_code: int, *, reason: str = "", message: str = "",
             pod_reason: str | None = None, at: datetime | None = None) -> None:
        pod["spec"]["nodeName"] = pod["spec"].get("nodeName") or self._any_node()
        if pod["status"].get("phase") not in ("Succeeded", "Failed"):
            for container in pod["spec"]["containers"]:
                self._write_log(pod, container["name"], f"exited with code {exit_code}")
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 and not pod_reason else "Failed"
        self._set_condition(pod, "Ready", "False", reason="PodCompleted")
        if pod_reason:
            pod["status"]["reason"] = pod_reason
            pod["status"]["message"] = message or "Pod was active on the node longer than the specified deadline"
        terminated = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                      "finishedAt": _now_text(at)}
        started = [((c.get("state") or {}).get("running") or {}).get("startedAt")
                   for c in pod["status"].get("containerStatuses") or []]
        if started and started[0]:
            terminated["startedAt"] = started[0]
        if message and not pod_reason:
            terminated["message"] = message
        pod["status"]["containerStatuses"] = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
             "started": False, "state": {"terminated": dict(terminated)}}
            for c in pod["spec"]["containers"]]
        self._modified("pods", pod)

    def _pod_changed(self, pod: dict) -> None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            job = next((j for j in self._objects["jobs"].values() if j["metadata"]["uid"] == ref.get("uid")), None)
            if job is not None:
                self._job_sync(job)

    def _job_sync(self, job: dict) -> None:
        """The Job controller, enough for the agent: honour suspend, create missing pods, count, set
        conditions. The changes it makes to the Job's pods do not re-enter it."""
        uid = job["metadata"]["uid"]
        if uid in self._syncing:
            return
        self._syncing.add(uid)
        try:
            self._job_sync_now(job)
        finally:
            self._syncing.discard(uid)

    @staticmethod
    def _ensure_job_condition(job: dict, kind: str, status: str, reason: str = "", message: str = "") -> bool:
        """The controller's ensureJobConditionStatus: set a condition (a False one only over an existing one);
        whether anything changed."""
        conditions = list(job["status"].get("conditions") or [])
        now = _now_text()
        fresh = {"type": kind, "status": status, "lastProbeTime": now, "lastTransitionTime": now}
        if reason:
            fresh["reason"] = reason
        if message:
            fresh["message"] = message
        for i, condition in enumerate(conditions):
            if condition.get("type") == kind:
                if (condition.get("status"), condition.get("reason", ""), condition.get("message", "")) == \
                        (status, reason, message):
                    return False
                conditions[i] = fresh
                job["status"]["conditions"] = conditions
                return True
        if status == "False":
            return False
        job["status"]["conditions"] = [*conditions, fresh]
        return True

    def _job_sync_now(self, job: dict) -> None:
        spec, status = job["spec"], job.setdefault("status", {})
        if spec.get("managedBy") not in (None, JOB_CONTROLLER):
            return  # another controller manages it (spec.managedBy): the Job controller leaves it alone
        if job["metadata"].get("deletionTimestamp"):
            return
        if _true_condition(job, "Complete") or _true_condition(job, "Failed"):
            return

        def running(pod: dict) -> bool:
            return pod["status"].get("phase") in ("Pending", "Running")

        if spec.get("suspend"):  # a suspended Job has no active pods: they are deleted
            for pod in self._owned_pods(job):
                if running(pod) and not pod["metadata"].get("deletionTimestamp"):
                    self._delete_pod(pod, None)
            active = sum(1 for p in self._owned_pods(job) if running(p) and not p["metadata"].get("deletionTimestamp"))
            changed = self._ensure_job_condition(job, "Suspended", "True", "JobSuspended", "Job suspended")
            if status.get("active", 0) != active:
                status["active"] = active
                changed = True
            if changed:
                self._modified("jobs", job)
            return
        resumed = self._ensure_job_condition(job, "Suspended", "False", "JobResumed", "Job resumed")
        if resumed:
            status["startTime"] = _now_text()  # a resumed Job starts its clock again
        pods = self._owned_pods(job)
        succeeded = sum(1 for p in pods if p["status"].get("phase") == "Succeeded")
        failed = sum(1 for p in pods if p["status"].get("phase") == "Failed")
        completions = spec.get("completions")
        if failed > spec.get("backoffLimit", 6):
            status.update(succeeded=succeeded, failed=failed)
            self._job_fails(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            return
        if completions is not None and succeeded >= completions:
            status.update(succeeded=succeeded, failed=failed, active=0)
            self._ensure_job_condition(job, "SuccessCriteriaMet", "True")
            self._ensure_job_condition(job, "Complete", "True")
            status["completionTime"] = _now_text()
            self._modified("jobs", job)
            return
        indexed = spec.get("completionMode") == "Indexed"

        def index_of(pod: dict) -> str | None:
            return (pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")

        active = [p for p in pods if running(p)]
        taken = {index_of(p) for p in pods if p["status"].get("phase") == "Succeeded"} | {index_of(p) for p in active}
        total = completions if completions is not None else spec.get("parallelism", 1)
        want = min(spec.get("parallelism", 1), total - succeeded) - len(active)
        for index in range(total):
            if want <= 0:
                break
            if indexed and str(index) in taken:
                continue
            self._job_pod(job, index if indexed else None)
            want -= 1
        active = [p for p in self._owned_pods(job) if running(p)]
        counts = {"succeeded": succeeded, "failed": failed, "active": len(active)}
        if any(status.get(k, 0) != v for k, v in counts.items()) or "startTime" not in status or resumed:
            status.update(counts)
            status.setdefault("startTime", _now_text())
            self._modified("jobs", job)

    def _job_pod(self, job: dict, index: int | None) -> None:
        template = copy.deepcopy(job["spec"]["template"])
        metadata = template.get("metadata") or {}
        name = job["metadata"]["name"]
        pod_name = f"{name}-{index}-{_suffix()}" if index is not None else f"{name}-{_suffix()}"
        annotations = dict(metadata.get("annotations") or {})
        labels = dict(metadata.get("labels") or {})
        if index is not None:
            annotations["batch.kubernetes.io/job-completion-index"] = str(index)
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": job["metadata"]["namespace"], "labels": labels,
                            "annotations": annotations,
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                                 "uid": job["metadata"]["uid"], "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": template["spec"]}
        self._create(RESOURCES["pods"], job["metadata"]["namespace"], pod)

    def _job_fails(self, job: dict, reason: str, message: str) -> None:
        status = job.setdefault("status", {})
        self._ensure_job_condition(job, "FailureTarget", "True", reason, message)
        self._ensure_job_condition(job, "Failed", "True", reason, message)
        for pod in self._owned_pods(job):  # the controller deletes a failed Job's active pods
            if pod["status"].get("phase") in ("Pending", "Running"):
                self._delete_pod(pod, None)
        status["active"] = 0
        self._modified("jobs", job)

    # -- internals: timers and the autopilot ---------------------------------------------------
    def _later(self, delay: float, action: tuple) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), action))
        self._cond.notify_all()

    def _controller(self) -> None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, action = heapq.heappop(self._timers)
                    self._fire(action)
                if self._autopilot:
                    self._autopilot_pass()
                timeout = 0.5
                if self._timers:
                    timeout = min(timeout, max(self._timers[0][0] - time.monotonic(), 0.0))
                self._cond.wait(timeout)

    def _fire(self, action: tuple) -> None:
        kind, key = action[0], action[1]
        if kind == "remove-pod":  # the kubelet is done with it: it goes, or its finalizers hold it (grace 0)
            pod = self._objects["pods"].get(key)
            if pod is not None and pod["metadata"].get("finalizers"):
                if pod["metadata"].get("deletionGracePeriodSeconds") != 0:
                    pod["metadata"]["deletionGracePeriodSeconds"] = 0
                    self._modified("pods", pod)
            else:
                self._remove("pods", key)
        elif kind == "end-pod":
            pod = self._objects["pods"].get(key)
            if pod is not None and pod["status"].get("phase") == "Running" \
                    and not pod["metadata"].get("deletionTimestamp"):
                self._end(pod, action[2])

    def _autopilot_pass(self) -> None:
        nodes = [n for n in self._objects["nodes"].values() if not n["spec"].get("unschedulable")
                 and any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])]
        if not nodes:
            return
        from sluice.quantity import (  # a test helper may use Sluice's arithmetic
            fits,
            parse_resources,
            subtract,
        )

        free = {n["metadata"]["name"]: parse_resources(n["status"]["allocatable"]) for n in nodes}
        pods = sorted(self._objects["pods"].values(), key=lambda p: int(p["metadata"]["resourceVersion"]))
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node in free and pod["status"].get("phase") in ("Pending", "Running"):
                free[node] = subtract(free[node], _pod_request(pod))
        for pod in pods:
            if pod["status"].get("phase") != "Pending" or pod["spec"].get("nodeName") \
                    or pod["metadata"].get("deletionTimestamp"):
                continue
            request = _pod_request(pod)
            target = next((name for name in sorted(free) if fits(request, free[name])), None)
            if target is None:
                message = f"0/{len(self._objects['nodes'])} nodes are available: insufficient resources."
                current = next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)
                if current is None or current.get("message") != message:
                    self._set_condition(pod, "PodScheduled", "False", reason="Unschedulable", message=message)
                    self._modified("pods", pod)
                continue
            free[target] = subtract(free[target], request)
            self._run(pod, target)
            annotations = pod["metadata"].get("annotations") or {}
            seconds = annotations.get(RUN_SECONDS_ANNOTATION)
            if seconds is not None:
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                self._later(float(seconds), ("end-pod", key, int(annotations.get(EXIT_CODE_ANNOTATION, "0"))))

    # -- internals: HTTP -----------------------------------------------------------------------
    def _take_fault(self, method: str, path: str, watch: bool) -> _Fault | None:
        with self._cond:
            for fault in self._faults:
                if fault.times > 0 and fault.method in ("*", method) and fault.path.search(path) \
                        and (fault.watch is None or fault.watch == watch):
                    fault.times -= 1
                    return fault
            return None

    def _close_sockets(self) -> None:
        with self._cond:
            sockets = list(self._open_sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _pod_request(pod: dict) -> dict[str, int]:
    from sluice.quantity import add, parse_resources

    total: dict[str, int] = {}
    for container in pod["spec"].get("containers") or []:
        total = add(total, parse_resources((container.get("resources") or {}).get("requests") or {}))
    return total


def _container_names(pod: dict) -> list[str]:
    spec = pod["spec"]
    return [c["name"] for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])]


def _log_container(pod: dict, requested: str) -> str:
    """The container a log request reads, or the API server's 400 for a missing or unknown name."""
    name = pod["metadata"]["name"]
    containers = [c["name"] for c in pod["spec"].get("containers") or []]
    init = [c["name"] for c in pod["spec"].get("initContainers") or []]
    if not requested:
        if len(containers) == 1 and not init:
            return containers[0]
        message = f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]"
        if init:
            message += f" or one of the init containers: [{' '.join(init)}]"
        raise ApiError(400, "BadRequest", message)
    if requested not in containers + init:
        raise ApiError(400, "BadRequest", f"container {requested} is not valid for pod {name}")
    return requested


def _container_state(pod: dict, container: str) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == container), {})


def _waiting_to_start(pod: dict, container: str) -> str | None:
    """Why the container has no log yet (the kubelet's waiting reason), or None when it has one."""
    status = _container_state(pod, container)
    state = status.get("state") or {}
    if "running" in state or "terminated" in state or (status.get("lastState") or {}).get("terminated"):
        return None
    return (state.get("waiting") or {}).get("reason") or ("PodInitializing" if status else "ContainerCreating")


def _log_ended(pod: dict, container: str) -> bool:
    return pod["status"].get("phase") in ("Succeeded", "Failed") \
        or "terminated" in (_container_state(pod, container).get("state") or {})


def _count_param(query: dict, key: str) -> int | None:
    text = query.get(key)
    if text in (None, ""):
        return None
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, "BadRequest", f"{key}: invalid value {text!r}: not an integer") from None
    if value < 0:
        raise ApiError(422, "Invalid", f"PodLogOptions \"\" is invalid: {key}: Invalid value: {value}: "
                                       "must be greater than or equal to 0")
    return value


def _filtered(kind: str, obj: dict, before: dict | None, match) -> tuple[str | None, dict]:
    """The event a watch with selectors sees, as the API server's watch cache sends it: a change that brings
    an object into the selection is ADDED, one that takes it out DELETED (with the object as it was)."""
    if kind != "MODIFIED":
        return (kind if match(obj) else None), obj
    now, was = match(obj), before is not None and match(before)
    if now:
        return ("MODIFIED" if was else "ADDED"), obj
    return ("DELETED", before) if was else (None, obj)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up (a stopped watch, a closed pool) is not an error here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeKube

    def log_message(self, *args) -> None:  # quiet
        pass

    def _raw(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    @staticmethod
    def _json(raw: bytes, *, required: bool) -> object:
        if not raw:
            if required:
                raise ApiError(400, "BadRequest", "the request body is empty")
            return None
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, "BadRequest", f"the body of the request was in an unknown format: {exc}") from None

    def _send(self, code: int, payload: dict, headers: dict | None = None, warnings: list[str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._record.status = code  # before the client can see the answer
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        for warning in warnings or []:
            self.send_header("Warning", f"299 - {json.dumps(warning)}")
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        fake = self.server_fake
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        self._record = RequestRecord(method, split.path, query, at=time.monotonic(),
                                     content_type=self.headers.get("Content-Type", ""))
        with fake._cond:
            fake.requests.append(self._record)
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            fake.tokens.add(auth[7:])
        try:
            raw = self._raw() if method in ("POST", "PUT", "DELETE", "PATCH") else b""
            fault = fake._take_fault(method, split.path, self._record.watch)
            if fault is not None:
                reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                           504: "Timeout", 502: "BadGateway"}
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                self._send(fault.status, _status(fault.status, reasons.get(fault.status, "InternalError"),
                                                 f"injected fault {fault.status}"), headers)
                return
            with fake._cond:
                discovery = fake._discovery(split.path) if method == "GET" else None
                if discovery is None:
                    resource, namespace, name, sub = fake._route(split.path)
            if discovery is not None:
                self._send(200, discovery)
                return
            if sub not in (None, "status" if resource.status else None, "log" if resource.key == "pods" else None):
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({split.path})")
            warnings: list[str] = []
            dry_run = query.get("dryRun", "")
            if dry_run not in ("", "All"):
                raise ApiError(400, "BadRequest", f'dryRun: Unsupported value: "{dry_run}": supported values: "All"')
            dry_run = dry_run == "All"
            if sub == "log":
                if method != "GET":
                    raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {split.path}")
                self._log(namespace or "", name or "", query)
            elif method == "GET" and name is None:
                if self._record.watch:
                    self._watch(resource, namespace, query)
                else:
                    self._list(resource, namespace, query)
            elif method == "GET":
                with fake._cond:
                    obj = fake._objects.get(resource.key, {}).get((namespace or "", name))
                    if obj is None:
                        raise _not_found(resource, name)
                    self._send(200, fake._present(resource, obj))
            elif method == "POST" and name is None:
                body = self._json(raw, required=True)
                with fake._cond:
                    created = fake._present(resource, fake._create(resource, namespace or "", body, query, warnings,
                                                                   dry_run=dry_run))
                self._send(201, created, warnings=warnings)
            elif method == "PUT" and name is not None:
                body = self._json(raw, required=True)
                with fake._cond:
                    updated = fake._present(resource, fake._update(resource, namespace or "", name, body,
                                                                   status=sub == "status", query=query,
                                                                   warnings=warnings, dry_run=dry_run))
                self._send(200, updated, warnings=warnings)
            elif method == "PATCH" and name is not None:
                with fake._cond:
                    patched = fake._present(resource, fake._patch(resource, namespace or "", name,
                                                                  self.headers.get("Content-Type", ""), raw,
                                                                  status=sub == "status", query=query,
                                                                  warnings=warnings, dry_run=dry_run))
                self._send(200, patched, warnings=warnings)
            elif method == "DELETE" and sub is None:
                options = self._json(raw, required=False) or {}
                if not isinstance(options, dict):
                    raise ApiError(400, "BadRequest", "the body of the request was in an unknown format: "
                                                      "DeleteOptions must be an object")
                orphan = query.get("orphanDependents", options.get("orphanDependents"))
                legacy = None if orphan is None else ("Orphan" if orphan in (True, "true") else "Background")
                # without a policy, batch/v1 Jobs orphan their pods (the Job strategy's default), the rest is
                # Background
                propagation = query.get("propagationPolicy") or options.get("propagationPolicy") or legacy \
                    or ("Orphan" if resource.key == "jobs" else "Background")
                grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                grace = None if grace is None else int(grace)
                with fake._cond:
                    if name is None:  # deletecollection
                        items = fake._delete_collection(resource, namespace, query, propagation, grace,
                                                        dry_run=dry_run)
                        answer = {"kind": resource.list_kind or f"{resource.kind}List",
                                  "apiVersion": resource.api_version,
                                  "metadata": {"resourceVersion": str(fake._rv)}, "items": items}
                    else:
                        answer = fake._delete(resource, namespace or "", name, propagation, grace,
                                              options.get("preconditions"), dry_run=dry_run or options.get(
                                                  "dryRun") == ["All"])
                self._send(200, answer)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {split.path}")
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug of the fake: answered, so that a test fails on it rather than hangs
            self.server_fake.errors.append(f"{method} {split.path}: {exc!r}")
            self.close_connection = True
            self._send(500, _status(500, "InternalError", f"fakekube failed on {method} {split.path}: {exc!r}"))

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _matching(self, resource: Resource, namespace: str | None, query: dict):
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))

        def match(obj: dict) -> bool:
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                return False
            return labels_match(obj["metadata"].get("labels") or {}, labels) and fields_match(obj, fields)
        return match

    def _list(self, resource: Resource, namespace: str | None, query: dict) -> None:
        fake = self.server_fake
        match = self._matching(resource, namespace, query)
        with fake._cond:
            rv = query.get("resourceVersion")
            if rv and rv != "0" and query.get("resourceVersionMatch") == "Exact" and int(rv) < fake._compacted:
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({fake._compacted})")
            items = [fake._present(resource, o) for _, o in sorted(fake._objects.get(resource.key, {}).items())
                     if match(o)]
            payload = {"kind": resource.list_kind or f"{resource.kind}List", "apiVersion": resource.api_version,
                       "metadata": {"resourceVersion": str(fake._rv)}, "items": items}
        self._send(200, payload)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    @contextlib.contextmanager
    def _streaming(self, content_type: str):
        """A 200 answer whose body the block writes with `_chunk` (an empty chunk ends it cleanly). The
        block raises ConnectionAbortedError to drop the connection (the server stops, watches are cut); a
        client hanging up ends it too. `stop()` shuts the socket down under a blocked write."""
        fake = self.server_fake
        self._record.status = 200
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sock = self.connection
        with fake._cond:
            fake._open_sockets.add(sock)
        try:
            yield
        except (ConnectionAbortedError, BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        finally:
            with fake._cond:
                fake._open_sockets.discard(sock)

    def _watch(self, resource: Resource, namespace: str | None, query: dict) -> None:
        fake = self.server_fake
        match = self._matching(resource, namespace, query)
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        rv_text = query.get("resourceVersion") or ""
        with self._streaming("application/json"):
            with fake._cond:
                generation = fake._watch_generation
                pending: list[dict] = []
                if rv_text in ("", "0"):
                    position = fake._rv
                    pending = [{"type": "ADDED", "object": fake._present(resource, o)}
                               for _, o in sorted(fake._objects.get(resource.key, {}).items()) if match(o)]
                else:
                    position = int(rv_text)
                    if position < fake._compacted - 1:  # the events after it are no longer kept
                        pending = [{"type": "ERROR", "object": _status(
                            410, "Expired", f"too old resource version: {position} ({fake._compacted - 1})")}]
                        position = -1
            for event in pending:
                self._chunk(json.dumps(event).encode() + b"\n")
            if position < 0:
                self._chunk(b"")
                return
            last_bookmark = time.monotonic()
            while True:
                with fake._cond:
                    while True:
                        if fake._stopping or fake._watch_generation != generation:
                            raise ConnectionAbortedError
                        events = [h for h in fake._history if h[0] > position and h[1] == resource.key]
                        gone = resource.crd and resource.key not in fake._objects  # its CRD was deleted
                        if events or gone or time.monotonic() >= deadline:
                            break
                        if bookmarks and time.monotonic() - last_bookmark > 1.0:
                            break
                        fake._cond.wait(min(0.5, max(deadline - time.monotonic(), 0.01)))
                    current = fake._rv
                if not events and (gone or time.monotonic() >= deadline):
                    self._chunk(b"")  # the server's timeout (or the kind is no longer served): a clean end
                    return
                for rv, _, kind, obj, before in events:
                    position = rv
                    kind, obj = _filtered(kind, obj, before, match)
                    if kind is not None:
                        if resource.crd:
                            obj = {**obj, "apiVersion": resource.api_version}
                        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                if not events and bookmarks:
                    position = current
                    last_bookmark = time.monotonic()
                    self._chunk(json.dumps({"type": "BOOKMARK", "object": {
                        "kind": resource.kind, "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(current)}}}).encode() + b"\n")

    def _log(self, namespace: str, name: str, query: dict) -> None:
        """A container's log as the kubelet serves it through the API server: text/plain lines."""
        fake = self.server_fake
        follow = query.get("follow") in ("true", "1")
        timestamps = query.get("timestamps") in ("true", "1")
        tail, since, limit = (_count_param(query, k) for k in ("tailLines", "sinceSeconds", "limitBytes"))
        with fake._cond:
            pod = fake._objects["pods"].get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            container = _log_container(pod, query.get("container") or "")
            if query.get("previous") in ("true", "1"):
                raise ApiError(400, "BadRequest", f'previous terminated container "{container}" in pod "{name}" '
                                                  "not found")
            waiting = _waiting_to_start(pod, container)
            if waiting is not None:
                raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: '
                                                  f"{waiting}")
            uid = pod["metadata"]["uid"]
            entries = list(fake._logs.get((namespace, name), {}).get(container, []))
        position = len(entries)
        if since is not None:
            entries = [e for e in entries if e[0] >= datetime.now(UTC) - timedelta(seconds=since)]
        if tail is not None:
            entries = entries[-tail:] if tail else []
        budget = [limit]

        def render(items: list[tuple[datetime, str]]) -> bytes:
            data = b"".join((at.strftime("%Y-%m-%dT%H:%M:%S.%f000Z ") if timestamps else "").encode()
                            + line.encode() + b"\n" for at, line in items)
            if budget[0] is not None:
                data, budget[0] = data[:budget[0]], max(budget[0] - len(data), 0)
            return data

        if not follow:
            data = render(entries)
            self._record.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        with self._streaming("text/plain"):
            while True:
                data = render(entries)
                if data:
                    self._chunk(data)
                if budget[0] == 0:
                    self._chunk(b"")
                    return
                with fake._cond:
                    while True:
                        if fake._stopping:
                            raise ConnectionAbortedError
                        pod = fake._objects["pods"].get((namespace, name))
                        if pod is None or pod["metadata"]["uid"] != uid:
                            entries, ended = [], True
                            break
                        lines = fake._logs.get((namespace, name), {}).get(container, [])
                        entries, ended = lines[position:], _log_ended(pod, container)
                        if entries or ended:
                            break
                        fake._cond.wait(0.5)
                    position += len(entries)
                if ended:
                    data = render(entries)
                    if data:
                        self._chunk(data)
                    self._chunk(b"")  # the container is done, or the pod is gone: the stream ends
                    return
