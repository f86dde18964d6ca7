"""A fake Kubernetes API server for the agent's tests: the real REST wire format over HTTP on loopback.

It is the one fake in the test suite (the process boundary the kubernetes backend talks across), so the
real `kubernetes` client library runs unchanged against it. It serves what the agent uses:

- namespaces and nodes (cluster-scoped), pods, events and batch/v1 jobs (namespaced, and listed across
  all namespaces): create, get, list, watch, delete;
- list and watch with `labelSelector` (=, ==, !=, in, notin, exists, !exists) and `fieldSelector`
  (=, ==, != on dotted paths such as status.phase, spec.nodeName, involvedObject.name);
- watch (`?watch=true`): a chunked stream of JSON lines `{"type": ..., "object": ...}` from a
  resourceVersion, with `allowWatchBookmarks` and `timeoutSeconds`; a resourceVersion older than the
  retained history gets the API server's `ERROR` event with a 410 Expired Status, a list request with
  one gets a 410 response;
- pod logs (`GET .../pods/{name}/log`, text/plain) with `container`, `tailLines`, `timestamps`,
  `sinceSeconds`, `limitBytes`, `previous` and `follow`: a chunked stream of the lines so far, then of
  each line appended, ending when the container terminates, the pod is deleted or the server stops. An
  unknown pod is 404, a pod of several containers with none named 400 (as is a container that has not
  started, with the API server's "is waiting to start" message). A pod's containers log "started" when
  they start and "exited with code N" when they end; tests add lines with `append_log`;
- delete with `propagationPolicy` (query or DeleteOptions body): pods on a node terminate gracefully
  (deletionTimestamp first, gone `pod_termination_s` later); a Job deleted `Foreground` keeps a
  `foregroundDeletion` finalizer until its pods are gone, `Background` goes at once and its pods
  after, `Orphan` leaves them without an owner;
- the API server's answers: 201 on create, 409 AlreadyExists, 404 NotFound (also for a missing
  namespace), 422 Invalid after validating every created object with `kubernetes-validate` (the real
  OpenAPI schemas, shipped offline) plus the semantic checks listed in `_semantic_errors`, and 429 or
  5xx on demand (`fail`).

A minimal Job controller creates each Job's pods (Indexed or not), owns them, counts succeeded and
failed pods and sets the Complete or Failed condition. Tests act as scheduler and kubelet through
`schedule`, `run_pod` (which gives the pod an IP, 10.244.0.1 up, unless it has one), `set_pod_ip`,
`succeed_pod`, `fail_pod`, `image_pull_error`, ... or switch on `autopilot`,
which binds pending pods first-fit to Ready schedulable nodes with room, runs them and ends them
after the seconds their `fakekube.test/run-seconds` annotation says (exit code from
`fakekube.test/exit-code`), leaving pods that fit nowhere Pending with the scheduler's message.

Every request is recorded in `requests` (method, path, query, status), every delete in `deletions`.
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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

KUBERNETES_VERSION = "1.33"
RUN_SECONDS_ANNOTATION = "fakekube.test/run-seconds"
EXIT_CODE_ANNOTATION = "fakekube.test/exit-code"


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    api_version: str
    namespaced: bool

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"


RESOURCES = {r.plural: r for r in (
    Resource("namespaces", "Namespace", "v1", False),
    Resource("nodes", "Node", "v1", False),
    Resource("pods", "Pod", "v1", True),
    Resource("events", "Event", "v1", True),
    Resource("jobs", "Job", "batch/v1", True),
)}
_PREFIXES = {"/api/v1": "v1", "/apis/batch/v1": "batch/v1"}


@dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    status: int = 0
    at: float = 0.0  # time.monotonic() when the request arrived

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


def _now_text(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    elif resource.plural in ("namespaces", "jobs") and (len(name) > 63 or not _DNS_LABEL.fullmatch(name)):
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
    if resource.plural == "pods":
        errors += _pod_spec_errors(obj.get("spec") or {}, "spec", in_job=False)
    if resource.plural == "jobs":
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        check_labels((template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
        errors += _pod_spec_errors(template.get("spec") or {}, "spec.template.spec", in_job=True)
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
            errors.append(("spec.completions", "Required value: when completion mode is Indexed"))
        for key in ("parallelism", "completions", "backoffLimit"):
            if spec.get(key) is not None and spec[key] < 0:
                errors.append((f"spec.{key}", "Invalid value: must be greater than or equal to 0"))
    return errors


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
        self._objects: dict[str, dict[tuple[str, str], dict]] = {plural: {} for plural in RESOURCES}
        self._history: list[tuple[int, str, str, dict]] = []  # (rv, plural, type, object)
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
        with self._cond:
            obj = self._objects[plural].get((namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, plural: str, namespace: str | None = None, selector: str = "") -> list[dict]:
        requirements = parse_label_selector(selector)
        with self._cond:
            return [copy.deepcopy(o) for (ns, _), o in sorted(self._objects[plural].items())
                    if (namespace is None or ns == namespace)
                    and labels_match(o["metadata"].get("labels") or {}, requirements)]

    def put(self, obj: dict) -> dict:
        """Create an object as a cluster admin would (validated like any create)."""
        plural = next(r.plural for r in RESOURCES.values() if r.kind == obj["kind"])
        with self._cond:
            return copy.deepcopy(self._create(RESOURCES[plural], obj["metadata"].get("namespace", ""),
                                              copy.deepcopy(obj)))

    def delete(self, plural: str, namespace: str, name: str, propagation: str = "Background") -> None:
        """Delete an object as someone else would (kubectl delete)."""
        with self._cond:
            self._delete(RESOURCES[plural], namespace, name, propagation, None)

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

    # -- internals: store ----------------------------------------------------------------------
    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _record(self, plural: str, kind: str, obj: dict) -> None:
        self._history.append((int(obj["metadata"]["resourceVersion"]), plural, kind, copy.deepcopy(obj)))
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

    def _create(self, resource: Resource, namespace: str, obj: dict) -> dict:
        metadata = obj.setdefault("metadata", {})
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
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + _suffix()
        self._validate(resource, obj)
        key = (namespace if resource.namespaced else "", metadata["name"])
        if key in self._objects[resource.plural]:
            raise ApiError(409, "AlreadyExists", f'{resource.plural} "{metadata["name"]}" already exists',
                           {"name": metadata["name"], "kind": resource.plural})
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        metadata["uid"] = f"uid-{next(self._timer_seq)}-{_suffix()}"
        metadata["creationTimestamp"] = _now_text()
        metadata["resourceVersion"] = self._bump()
        self._defaults(resource, obj)
        self._objects[resource.plural][key] = obj
        self._record(resource.plural, "ADDED", obj)
        if resource.plural == "jobs":
            self._job_sync(obj)
        if resource.plural == "pods" and self._autopilot:
            self._cond.notify_all()
        return obj

    def _validate(self, resource: Resource, obj: dict) -> None:
        candidate = {**obj, "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind")}
        name = (obj.get("metadata") or {}).get("name", "")
        if candidate["apiVersion"] != resource.api_version or candidate["kind"] != resource.kind:
            raise ApiError(400, "BadRequest", f"the API version in the data ({candidate['apiVersion']}) and kind "
                                              f"({candidate['kind']}) do not match {resource.api_version} "
                                              f"{resource.kind}")
        causes = []
        try:
            kubernetes_validate.validate(candidate, self.version, strict=self.strict)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in exc.path).replace(".[", "[")
            causes.append((path or "<root>", f"Invalid value: {exc.message}"))
        causes += _semantic_errors(resource, candidate)
        if causes:
            text = ", ".join(f"{f}: {m}" for f, m in causes)
            raise ApiError(422, "Invalid", f'{resource.kind} "{name}" is invalid: {text}',
                           {"name": name, "kind": resource.kind,
                            "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes]})

    def _defaults(self, resource: Resource, obj: dict) -> None:
        if resource.plural == "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        elif resource.plural == "pods":
            spec = obj["spec"]
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("serviceAccountName", "default")
            obj["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        elif resource.plural == "jobs":
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

    def _remove(self, plural: str, key: tuple[str, str]) -> None:
        obj = self._objects[plural].pop(key, None)
        if obj is None:
            return
        if plural == "pods":
            self._logs.pop(key, None)
        obj["metadata"]["resourceVersion"] = self._bump()
        self._record(plural, "DELETED", obj)
        if plural == "pods":
            self._owner_pod_gone(obj)
        if plural == "namespaces":
            for other in ("pods", "jobs", "events"):
                for okey in [k for k in self._objects[other] if k[0] == key[1]]:
                    self._remove(other, okey)

    def _delete(self, resource: Resource, namespace: str, name: str, propagation: str, grace: int | None) -> dict:
        key = (namespace if resource.namespaced else "", name)
        obj = self._objects[resource.plural].get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found',
                           {"name": name, "kind": resource.plural})
        self.deletions.append((resource.plural, key[0], name, propagation))
        if resource.plural == "pods":
            self._delete_pod(obj, grace)
        elif resource.plural == "jobs":
            self._delete_job(obj, propagation)
        else:
            self._remove(resource.plural, key)
        return copy.deepcopy(obj)

    def _delete_pod(self, pod: dict, grace: int | None) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        running_on_node = pod["spec"].get("nodeName") and pod["status"].get("phase") in ("Pending", "Running")
        if not running_on_node or grace == 0 or self.pod_termination_s <= 0:
            self._remove("pods", key)
            return
        if pod["metadata"].get("deletionTimestamp"):
            return
        pod["metadata"]["deletionTimestamp"] = _now_text()
        pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
        self._modified("pods", pod)
        self._later(self.pod_termination_s, ("remove-pod", key))

    def _delete_job(self, job: dict, propagation: str) -> None:
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        pods = self._owned_pods(job)
        if propagation == "Orphan":
            for pod in pods:
                pod["metadata"].pop("ownerReferences", None)
                self._modified("pods", pod)
            self._remove("jobs", key)
        elif propagation == "Foreground" and pods:
            job["metadata"]["deletionTimestamp"] = _now_text()
            job["metadata"].setdefault("finalizers", []).append("foregroundDeletion")
            self._modified("jobs", job)
            for pod in pods:
                self._delete_pod(pod, None)
        else:  # Background: the owner goes now, the garbage collector takes its pods after it
            self._remove("jobs", key)
            for pod in pods:
                self._delete_pod(pod, None)

    def _owned_pods(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        return [p for p in self._objects["pods"].values()
                if any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences") or [])]

    def _owner_pod_gone(self, pod: dict) -> None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            job = next((j for j in self._objects["jobs"].values() if j["metadata"]["uid"] == ref.get("uid")), None)
            if job is not None and "foregroundDeletion" in (job["metadata"].get("finalizers") or []) \
                    and not self._owned_pods(job):
                self._remove("jobs", (job["metadata"]["namespace"], job["metadata"]["name"]))

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
        """The Job controller, enough for the agent: create missing pods, count, set conditions."""
        spec, status = job["spec"], job.setdefault("status", {})
        if job["metadata"].get("deletionTimestamp") or spec.get("suspend"):
            return
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in status.get("conditions") or []):
            return
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
            status["conditions"] = [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": _now_text()},
                                    {"type": "Complete", "status": "True", "lastTransitionTime": _now_text()}]
            status["completionTime"] = _now_text()
            job["metadata"]["resourceVersion"] = self._bump()
            self._record("jobs", "MODIFIED", job)
            return
        indexed = spec.get("completionMode") == "Indexed"

        def index_of(pod: dict) -> str | None:
            return (pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")

        active = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]
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
        active = [p for p in self._owned_pods(job) if p["status"].get("phase") in ("Pending", "Running")]
        counts = {"succeeded": succeeded, "failed": failed, "active": len(active)}
        if any(status.get(k, 0) != v for k, v in counts.items()) or "startTime" not in status:
            status.update(counts)
            status.setdefault("startTime", _now_text())
            job["metadata"]["resourceVersion"] = self._bump()
            self._record("jobs", "MODIFIED", job)

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
        status["conditions"] = [{"type": "FailureTarget", "status": "True", "reason": reason, "message": message,
                                 "lastTransitionTime": _now_text()},
                                {"type": "Failed", "status": "True", "reason": reason, "message": message,
                                 "lastTransitionTime": _now_text()}]
        for pod in self._owned_pods(job):  # the controller deletes a failed Job's active pods
            if pod["status"].get("phase") in ("Pending", "Running"):
                self._delete_pod(pod, None)
        status["active"] = 0
        job["metadata"]["resourceVersion"] = self._bump()
        self._record("jobs", "MODIFIED", job)

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
        if kind == "remove-pod":
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


def _route(path: str) -> tuple[Resource, str | None, str | None, str | None]:
    """(resource, namespace or None, name or None, subresource or None) for an API path."""
    for prefix in _PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            parts = [p for p in path[len(prefix):].split("/") if p]
            break
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    namespace = None
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts or parts[0] not in RESOURCES:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    resource = RESOURCES[parts[0]]
    if resource.api_version != _PREFIXES[prefix]:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if namespace is not None and not resource.namespaced:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    name = parts[1] if len(parts) > 1 else None
    sub = parts[2] if len(parts) > 2 else None
    return resource, namespace, name, sub


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up (a stopped watch, a closed pool) is not an error here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeKube

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ApiError(400, "BadRequest", f"the body of the request was in an unknown format: {exc}") from None

    def _send(self, code: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self._record.status = code  # before the client can see the answer
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        fake = self.server_fake
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        self._record = RequestRecord(method, split.path, query, at=time.monotonic())
        with fake._cond:
            fake.requests.append(self._record)
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            fake.tokens.add(auth[7:])
        try:
            body = self._body() if method in ("POST", "PUT", "DELETE", "PATCH") else None
            fault = fake._take_fault(method, split.path, self._record.watch)
            if fault is not None:
                reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                           504: "Timeout", 502: "BadGateway"}
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                self._send(fault.status, _status(fault.status, reasons.get(fault.status, "InternalError"),
                                                 f"injected fault {fault.status}"), headers)
                return
            resource, namespace, name, sub = _route(split.path)
            if sub is not None and (sub, resource.plural) not in (("status", resource.plural), ("log", "pods")):
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({split.path})")
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
                    obj = fake._objects[resource.plural].get((namespace or "", name))
                    if obj is None:
                        raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found',
                                       {"name": name, "kind": resource.plural})
                    self._send(200, copy.deepcopy(obj))
            elif method == "POST" and name is None:
                if body is None:
                    raise ApiError(400, "BadRequest", "the request body is empty")
                with fake._cond:
                    created = copy.deepcopy(fake._create(resource, namespace or "", body))
                self._send(201, created)
            elif method == "DELETE" and name is not None:
                options = body or {}
                propagation = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
                grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                with fake._cond:
                    gone = fake._delete(resource, namespace or "", name, propagation,
                                        None if grace is None else int(grace))
                self._send(200, gone)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {split.path}")
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

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
            items = [copy.deepcopy(o) for _, o in sorted(fake._objects[resource.plural].items()) if match(o)]
            payload = {"kind": f"{resource.kind}List", "apiVersion": resource.api_version,
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
                    pending = [{"type": "ADDED", "object": copy.deepcopy(o)}
                               for _, o in sorted(fake._objects[resource.plural].items()) if match(o)]
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
                        events = [h for h in fake._history if h[0] > position and h[1] == resource.plural]
                        if events or time.monotonic() >= deadline:
                            break
                        if bookmarks and time.monotonic() - last_bookmark > 1.0:
                            break
                        fake._cond.wait(min(0.5, max(deadline - time.monotonic(), 0.01)))
                    current = fake._rv
                if not events and time.monotonic() >= deadline:
                    self._chunk(b"")  # the server's timeout: a clean end of the stream
                    return
                for rv, _, kind, obj in events:
                    position = rv
                    if match(obj):
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
