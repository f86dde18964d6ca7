"""Job files: parse and validate what users submit into frozen JobSpec values.

A job file holds one or more documents (YAML with '---', or JSON: one object or an array of objects),
each a Sluice `sluice.io/v1` Job or a plain Kubernetes `batch/v1` Job (see docs/api.md). Everything is
checked here, before anything reaches the dispatcher: a bad file fails with one SpecError naming the
document and the exact field ('spec.podSets[0].count: must be an integer, got string 'four''). Pod
templates are passed through untouched except for the checks Sluice needs (containers with a name and
an image) and the effective per-pod requests, computed as Kubernetes does.

JobSpec.to_document() writes the canonical Sluice form; job_from_document() reads it back to an equal
JobSpec.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from sluice import _validate as v
from sluice._validate import SpecError
from sluice.documents import parse_numbered_documents
from sluice.quantity import add, format_duration_exact, format_quantity

__all__ = ["SpecError", "PodSet", "Placement", "JobSpec", "Dependency", "JobArray", "job_from_document", "load_jobs",
           "pod_requests", "parse_array", "parse_start_after"]

API_VERSION = "sluice.io/v1"
KUBERNETES_API_VERSION = "batch/v1"
TIERS = ("onprem", "cloud", "edge")
ADMIN_KINDS = ("Queue", "ServiceClass", "Cluster", "BurstPolicy")

MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
MAX_POD_SETS = 16
MAX_POD_SET_COUNT = 10_000
MAX_PODS = 100_000
DEFAULT_MAX_RETRIES = 2
MAX_RETRIES = 100
MAX_NAME_LENGTH = 253
MAX_ARRAY = 100_000  # elements of one array: one submit's jobs at most
MAX_DEPENDENCIES = 64
CONDITIONS = ("succeeded", "failed", "finished")  # what a dependency waits for its job to do

# A Kubernetes Job becomes one pod set with this name.
KUBERNETES_POD_SET = "job"
QUEUE_ANNOTATION = "sluice.io/queue"
SERVICE_CLASS_ANNOTATION = "sluice.io/service-class"
PRIORITY_ANNOTATION = "sluice.io/priority"
# Annotation keys the sim backend reads from a pod template, checked at submit so no job carries one it
# cannot use: how long each pod runs (a duration) and the exit code it ends with.
SIM_DURATION_KEY = "sluice.io/sim-duration"
SIM_EXIT_CODE_KEY = "sluice.io/sim-exit-code"
MAX_EXIT_CODE = 255

_TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec")
_METADATA_FIELDS = ("name", "labels")
_PLAIN_SPEC_FIELDS = ("queue", "serviceClass", "priority", "podSets", "placement", "maxRetries", "maxRuntime")
# When and how many: a job with any of these waits (WAITING) or becomes many jobs (docs/user-guide.md).
_WHEN_FIELDS = ("startAfter", "dependsOn", "array", "interactive", "idleTimeout")
_SPEC_FIELDS = _PLAIN_SPEC_FIELDS + _WHEN_FIELDS
_DEPENDENCY_FIELDS = ("job", "condition")
_ARRAY_FIELDS = ("count", "parallelism", "first")
_POD_SET_FIELDS = ("name", "count", "template")
_PLACEMENT_FIELDS = ("clusterSelector", "tiers", "sites")


@dataclass(frozen=True)
class PodSet:
    """A group of identical pods; the whole job's pod sets are placed together or not at all."""

    name: str
    count: int
    template: dict  # the Kubernetes PodTemplateSpec as given (metadata + spec)
    requests: dict[str, int]  # effective per-pod requests, milli-units


@dataclass(frozen=True)
class Placement:
    cluster_selector: dict[str, str] = field(default_factory=dict)  # match on Cluster labels
    tiers: tuple[str, ...] = ()  # allowed tiers; () means any
    sites: tuple[str, ...] = ()  # allowed sites; () means any


@dataclass(frozen=True)
class Dependency:
    """Start only once another job has `condition`d: `job` is an id, or the name of a job of the same submit
    (else the newest job of that name its user submitted); a dependency on an array is on all its elements."""

    job: int | str
    condition: str = "succeeded"  # one of CONDITIONS


@dataclass(frozen=True)
class JobArray:
    """One document submitted as `count` jobs, indexes first..first+count-1, at most `parallelism` of them
    queued or running at once (None: no limit)."""

    count: int
    parallelism: int | None = None
    first: int = 0

    def to_document(self) -> dict:
        out: dict = {"count": self.count}
        if self.parallelism is not None:
            out["parallelism"] = self.parallelism
        if self.first:
            out["first"] = self.first
        return out


@dataclass(frozen=True)
class Origin:
    """The Kubernetes Job a job was submitted as through a cluster's API server (the kubectl front door): the
    cluster whose agent saw it and the object there. The dispatcher sets it; no submitted document can."""

    cluster: str
    namespace: str
    name: str
    uid: str

    def to_document(self) -> dict:
        return {"cluster": self.cluster, "namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class JobSpec:
    name: str | None
    labels: dict[str, str]
    queue: str | None
    service_class: str | None  # None: the queue's default class
    priority: int  # MIN_PRIORITY..MAX_PRIORITY, within one queue and class
    pod_sets: tuple[PodSet, ...]
    placement: Placement
    max_retries: int  # attempts after the first
    max_runtime_s: float | None  # seconds; None: no limit
    # When and how many (None and () for a job that is queued at once, as itself).
    start_after: datetime | float | None = None  # a time (aware), or seconds after the submit
    depends_on: tuple[Dependency, ...] = ()
    array: JobArray | None = None
    interactive: bool = False  # a session a user works in: ahead of batch work of its class, never evicted
    idle_timeout_s: float | None = None  # an interactive session nobody attached to for this long is ended
    origin: Origin | None = None  # a Job submitted through a cluster's API server

    def waits(self) -> bool:
        """Whether submitting it makes more than one queued job: it waits, or is an array."""
        return self.start_after is not None or bool(self.depends_on) or self.array is not None

    def total_requests(self) -> dict[str, int]:
        """Milli-units the whole job needs at once."""
        total: dict[str, int] = {}
        for pod_set in self.pod_sets:
            total = add(total, pod_set.requests, pod_set.count)
        return total

    def largest_pod(self) -> dict[str, int]:
        """Per resource, the most any single pod requests: some node must have at least this free."""
        largest: dict[str, int] = {}
        for pod_set in self.pod_sets:
            for resource, amount in pod_set.requests.items():
                largest[resource] = max(largest.get(resource, 0), amount)
        return largest

    def pod_count(self) -> int:
        return sum(pod_set.count for pod_set in self.pod_sets)

    def to_document(self, *, share_templates: bool = False) -> dict:
        """The canonical Sluice Job document (JSON- and YAML-safe). share_templates: the pod templates are
        this spec's own, not copies (for a caller that only serialises the document)."""
        metadata: dict = {}
        if self.name is not None:
            metadata["name"] = self.name
        metadata["labels"] = dict(self.labels)
        spec: dict = {}
        if self.queue is not None:
            spec["queue"] = self.queue
        if self.service_class is not None:
            spec["serviceClass"] = self.service_class
        spec["priority"] = self.priority
        spec["podSets"] = [{"name": p.name, "count": p.count,
                            "template": p.template if share_templates else json_copy(p.template)}
                           for p in self.pod_sets]
        spec["placement"] = {"clusterSelector": dict(self.placement.cluster_selector),
                             "tiers": list(self.placement.tiers), "sites": list(self.placement.sites)}
        spec["maxRetries"] = self.max_retries
        if self.max_runtime_s is not None:
            spec["maxRuntime"] = format_duration_exact(self.max_runtime_s)
        if self.start_after is not None:
            spec["startAfter"] = (format_time(self.start_after) if isinstance(self.start_after, datetime)
                                  else format_duration_exact(self.start_after))
        if self.depends_on:
            spec["dependsOn"] = [{"job": d.job, "condition": d.condition} for d in self.depends_on]
        if self.array is not None:
            spec["array"] = self.array.to_document()
        if self.interactive:
            spec["interactive"] = True
        if self.idle_timeout_s is not None:
            spec["idleTimeout"] = format_duration_exact(self.idle_timeout_s)
        if self.origin is not None:
            spec["origin"] = self.origin.to_document()
        return {"apiVersion": API_VERSION, "kind": "Job", "metadata": metadata, "spec": spec}


def json_copy(value):
    """A deep copy of JSON data (dicts, lists, scalars): what copy.deepcopy does for it, several times faster."""
    if isinstance(value, dict):
        return {k: json_copy(x) for k, x in value.items()}
    if isinstance(value, list):
        return [json_copy(x) for x in value]
    return value


# -- jobs --------------------------------------------------------------------------------------------

def job_from_document(doc: dict, *, queue: str | None = None, service_class: str | None = None,
                      document: int | None = None, source: str | None = None, owned: bool = False,
                      default_queue: Callable[[], str | None] | None = None) -> JobSpec:
    """Validate one Sluice or Kubernetes Job document. queue and service_class (the CLI's --queue and
    --class) override the document's. default_queue() names the queue of a document that names none
    (`kubectl sluice`: the namespace's), asked only then. owned: the caller hands the document over (it
    was just decoded and nothing else holds it), so its pod templates are kept rather than copied."""
    with v.located(document, source):
        doc = v.mapping(doc, "")
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        _check_kind(api_version, kind)
        if api_version == API_VERSION:
            job, queue_path = _plain_job(doc, owned) or _sluice_job(doc, owned), "spec.queue"
        else:
            job, queue_path = _kubernetes_job(doc, owned), f"metadata.annotations[{QUEUE_ANNOTATION}]"
        if queue is not None:
            job = replace(job, queue=v.name(queue, "--queue"))
        if service_class is not None:
            job = replace(job, service_class=v.name(service_class, "--class"))
        if job.queue is None and default_queue is not None:
            fallback = default_queue()
            if fallback is not None:
                job = replace(job, queue=v.name(fallback, "the namespace's queue"))
        if job.queue is None:
            raise SpecError(queue_path, "required (or give --queue)")
        return job


def load_jobs(text: str, *, queue: str | None = None, service_class: str | None = None,
              source: str = "<input>") -> list[JobSpec]:
    """Every job in a job file; an error names the file and the 1-based document."""
    return [job_from_document(doc, queue=queue, service_class=service_class, document=number, source=source)
            for number, doc in parse_numbered_documents(text, source=source)]


def _check_kind(api_version: object, kind: object) -> None:
    if api_version not in (API_VERSION, KUBERNETES_API_VERSION):
        expected = f"{API_VERSION} (or {KUBERNETES_API_VERSION} for a Kubernetes Job)"
        if api_version is None:
            raise SpecError("apiVersion", f"required: {expected}")
        raise SpecError("apiVersion", f"must be {expected}, got {v.describe(api_version)}")
    if kind != "Job":
        hint = " (admin objects are applied with `sluice admin apply`)" if kind in ADMIN_KINDS else ""
        raise SpecError("kind", f"must be Job, got {v.describe(kind)}{hint}")


def _sluice_job(doc: dict, owned: bool = False) -> JobSpec:
    v.check_fields(doc, _TOP_FIELDS, "")
    metadata = v.mapping(doc.get("metadata"), "metadata", allowed=_METADATA_FIELDS)
    spec = v.mapping(doc.get("spec"), "spec", allowed=_SPEC_FIELDS, required=True)
    return JobSpec(
        name=v.optional(v.string, metadata.get("name"), "metadata.name", max_len=MAX_NAME_LENGTH),
        labels=v.labels(metadata.get("labels"), "metadata.labels"),
        queue=v.optional(v.name, spec.get("queue"), "spec.queue"),
        service_class=v.optional(v.name, spec.get("serviceClass"), "spec.serviceClass"),
        priority=v.integer(v.get(spec, "priority", 0), "spec.priority", MIN_PRIORITY, MAX_PRIORITY),
        pod_sets=_pod_sets(spec.get("podSets"), "spec.podSets", owned),
        placement=_placement(spec.get("placement"), "spec.placement"),
        max_retries=v.integer(v.get(spec, "maxRetries", DEFAULT_MAX_RETRIES), "spec.maxRetries", 0, MAX_RETRIES),
        max_runtime_s=v.optional(v.duration, spec.get("maxRuntime"), "spec.maxRuntime", positive=True),
        **_when(spec),
    )


def _when(spec: dict) -> dict:
    """The JobSpec fields of startAfter, dependsOn, array, interactive and idleTimeout."""
    out: dict = {}
    if (start_after := spec.get("startAfter")) is not None:
        out["start_after"] = parse_start_after(start_after, "spec.startAfter")
    if (depends_on := spec.get("dependsOn")) is not None:
        out["depends_on"] = _dependencies(depends_on, "spec.dependsOn")
    if (array := spec.get("array")) is not None:
        out["array"] = _array(array, "spec.array")
    interactive = v.optional(v.boolean, spec.get("interactive"), "spec.interactive") or False
    idle = v.optional(v.duration, spec.get("idleTimeout"), "spec.idleTimeout", positive=True)
    if idle is not None and not interactive:
        raise SpecError("spec.idleTimeout", "only an interactive job (spec.interactive: true) has an idle timeout")
    if interactive and out.get("array") is not None:
        raise SpecError("spec.array", "an interactive session is one job: it cannot be an array")
    out["interactive"], out["idle_timeout_s"] = interactive, idle
    return out


def parse_start_after(value: object, path: str) -> datetime | float:
    """startAfter: an RFC 3339 time with its offset ('2026-12-01T03:00:00Z'), or a duration after the submit
    ('30m', or seconds)."""
    if isinstance(value, str) and ("T" in value or value.count("-") >= 2):
        try:
            at = datetime.fromisoformat(value.replace("z", "Z"))
        except ValueError:
            raise SpecError(path, f"{value!r} is neither a time (RFC 3339, e.g. 2026-12-01T03:00:00Z) nor a "
                                  "duration (e.g. 30m)") from None
        if at.tzinfo is None:
            raise SpecError(path, f"{value!r} has no time zone offset: add Z for UTC, or +01:00")
        return at.astimezone(UTC)
    if isinstance(value, datetime):  # YAML reads an unquoted time as one
        if value.tzinfo is None:
            raise SpecError(path, f"{value.isoformat()} has no time zone offset: add Z for UTC, or +01:00")
        return value.astimezone(UTC)
    return v.duration(value, path)


def format_time(at: datetime) -> str:
    """RFC 3339 in UTC, as `-o json` writes times."""
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _dependencies(value: object, path: str) -> tuple[Dependency, ...]:
    out: list[Dependency] = []
    for i, raw in enumerate(v.items(value, path, non_empty=True, max_items=MAX_DEPENDENCIES)):
        item_path = f"{path}[{i}]"
        item = v.mapping(raw, item_path, allowed=_DEPENDENCY_FIELDS)
        job = v.required(item, "job", item_path)
        if isinstance(job, bool) or not isinstance(job, (int, str)):
            raise SpecError(f"{item_path}.job", f"must be a job id or a job name, got {v.describe(job)}")
        if isinstance(job, int) and job < 1:
            raise SpecError(f"{item_path}.job", f"must be a job id (1 or more), got {job}")
        if isinstance(job, str):
            job = v.string(job, f"{item_path}.job", max_len=MAX_NAME_LENGTH)
            job = int(job) if job.isascii() and job.isdigit() else job
        condition = v.choice(v.get(item, "condition", "succeeded"), f"{item_path}.condition", CONDITIONS)
        if any(d.job == job for d in out):
            raise SpecError(f"{item_path}.job", f"{job!r} is named twice")
        out.append(Dependency(job, condition))
    return tuple(out)


def _array(value: object, path: str) -> JobArray:
    item = v.mapping(value, path, allowed=_ARRAY_FIELDS)
    count = v.integer(v.required(item, "count", path), f"{path}.count", 1, MAX_ARRAY)
    parallelism = v.optional(v.integer, item.get("parallelism"), f"{path}.parallelism", lo=1)
    first = v.integer(v.get(item, "first", 0), f"{path}.first", 0, 10_000_000)
    return JobArray(count, parallelism if parallelism is None or parallelism < count else None, first)


_ARRAY_FLAG = re.compile(r"^(\d+)-(\d+)(?:%(\d+))?$|^(\d+)(?:%(\d+))?$")


def parse_array(text: str, path: str = "--array") -> JobArray:
    """Slurm's way of writing an array: 0-99 (indexes 0 to 99), 0-99%10 (at most 10 at once), or 8 (0 to 7)."""
    found = _ARRAY_FLAG.match(text.strip())
    if not found:
        raise SpecError(path, f"{text!r} is not an array: write FIRST-LAST (0-99), FIRST-LAST%PARALLEL (0-99%10) "
                              "or a COUNT")
    if found[4] is not None:
        first, count, parallel = 0, int(found[4]), found[5]
    else:
        first, last, parallel = int(found[1]), int(found[2]), found[3]
        if last < first:
            raise SpecError(path, f"{text!r}: the last index comes before the first")
        count = last - first + 1
    return _array({"count": count, "first": first,
                   **({} if parallel is None else {"parallelism": int(parallel)})}, path)


def _plain_job(doc: dict, owned: bool) -> JobSpec | None:
    """The JobSpec of a Sluice Job in its plain form, checked in a few straight lines; None for any other
    document (a field of an unusual type, init containers, pod overhead, anything not valid...), which
    _sluice_job then reads, wording any error. A fast path for the server, which reads many documents:
    _sluice_job's layers (each check a call, each field's path made in case it is wrong) cost several
    times this. Whatever this takes, _sluice_job takes to the same JobSpec (tests/unit/test_spec.py:
    test_plain_documents_read_as_the_full_checks_read_them)."""
    metadata, spec = doc.get("metadata"), doc.get("spec")
    if (type(spec) is not dict or not doc.keys() <= _TOP_SET or not spec.keys() <= _SPEC_SET
            or metadata is not None and (type(metadata) is not dict or not metadata.keys() <= _METADATA_SET)):
        return None
    name = labels = None
    if metadata:
        name, labels = metadata.get("name"), metadata.get("labels")
    queue, service_class = spec.get("queue"), spec.get("serviceClass")
    priority, max_retries = spec.get("priority"), spec.get("maxRetries")
    priority = 0 if priority is None else priority
    max_retries = DEFAULT_MAX_RETRIES if max_retries is None else max_retries
    if (name is not None and (type(name) is not str or not 0 < len(name) <= MAX_NAME_LENGTH)
            or type(queue) is not str or queue not in _NAMES and not _passes(_NAMES, v.name, queue)
            or service_class is not None and (type(service_class) is not str or service_class not in _NAMES
                                              and not _passes(_NAMES, v.name, service_class))
            or type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY
            or type(max_retries) is not int or not 0 <= max_retries <= MAX_RETRIES):
        return None
    labels = _plain_labels(labels)
    pod_sets = _plain_pod_sets(spec.get("podSets"), owned)
    placement = _plain_placement(spec.get("placement"))
    if labels is None or pod_sets is None or placement is None:
        return None
    max_runtime = spec.get("maxRuntime")
    if max_runtime is not None:
        try:
            max_runtime = v.duration(max_runtime, "", positive=True)
        except SpecError:
            return None
    return _new(JobSpec, name=name, labels=labels, queue=queue, service_class=service_class, priority=priority,
                pod_sets=pod_sets, placement=placement, max_retries=max_retries, max_runtime_s=max_runtime,
                start_after=None, depends_on=(), array=None, interactive=False, idle_timeout_s=None)


def _plain_placement(placement: object) -> Placement | None:
    if placement is None:
        return _ANYWHERE
    if type(placement) is not dict or not placement.keys() <= _PLACEMENT_SET:
        return None
    selector, tiers, sites = (_plain_labels(placement.get("clusterSelector")), placement.get("tiers"),
                              placement.get("sites"))
    tiers, sites = [] if tiers is None else tiers, [] if sites is None else sites
    if (selector is None or type(tiers) is not list or any(t not in TIERS for t in tiers)
            or type(sites) is not list or any(type(s) is not str or not s for s in sites)):
        return None
    return Placement(selector, tuple(tiers), tuple(sites))


def _plain_labels(labels: object) -> dict[str, str] | None:
    if labels is None:
        return {}
    if type(labels) is not dict:
        return None
    for key, value in labels.items():
        if (type(key) is not str or key not in _LABEL_KEYS and not _passes(_LABEL_KEYS, v.label_key, key)
                or type(value) is not str or len(value) > 63):
            return None
    return dict(labels)


def _plain_pod_sets(value: object, owned: bool) -> tuple[PodSet, ...] | None:
    if type(value) is not list or not 0 < len(value) <= MAX_POD_SETS:
        return None
    pod_sets, names, pods = [], set(), 0
    for item in value:
        if type(item) is not dict or not item.keys() <= _POD_SET_SET:
            return None
        name, count, template = item.get("name"), item.get("count"), item.get("template")
        if (type(name) is not str or name not in _DNS_LABELS and not _passes(_DNS_LABELS, v.dns_label, name)
                or name in names or type(count) is not int
                or not 1 <= count <= MAX_POD_SET_COUNT or type(template) is not dict):
            return None
        requests = _plain_requests(template.get("spec"))
        if requests is None or not _plain_metadata(template):
            return None
        if (annotations := _sim_annotations(template)) is not None:
            values = (annotations.get(SIM_EXIT_CODE_KEY), annotations.get(SIM_DURATION_KEY))
            if type(values[0]) not in (str, type(None)) or type(values[1]) not in (str, type(None)) or (
                    values not in _SIM_VALUES and not _passes(_SIM_VALUES, _check_sim_values, values)):
                return None  # the full checks word the error
        names.add(name)
        pods += count
        pod_sets.append(_new(PodSet, name=name, count=count, template=template if owned else json_copy(template),
                             requests=requests))
    return tuple(pod_sets) if pods <= MAX_PODS else None


def _plain_requests(spec: object) -> dict[str, int] | None:
    """pod_requests of a pod spec without init containers or overhead; None for any other, and for one
    that is not valid."""
    if (type(spec) is not dict or spec.get("initContainers") is not None or spec.get("overhead") is not None
            or type(containers := spec.get("containers")) is not list or not containers):
        return None
    total: dict[str, int] = {}
    names = set()
    for container in containers:
        if type(container) is not dict:
            return None
        name, image, resources = container.get("name"), container.get("image"), container.get("resources")
        if type(name) is not str or not name or name in names or type(image) is not str or not image:
            return None
        names.add(name)
        if resources is None:
            continue
        if type(resources) is not dict:
            return None
        requests, limits = _plain_quantities(resources.get("requests")), _plain_quantities(resources.get("limits"))
        if requests is None or limits is None:
            return None
        for resource, limit in limits.items():
            if requests.setdefault(resource, limit) > limit:
                return None
        for resource, amount in requests.items():
            total[resource] = total.get(resource, 0) + amount
    return total


def _plain_quantities(value: object) -> dict[str, int] | None:
    try:
        return v.resources(value, "")
    except SpecError:
        return None


def _passes(seen: set, check, value: object) -> bool:
    """Whether `check` passes the string `value`, remembered in `seen` (the names and label keys documents
    repeat; emptied when it holds 4,096)."""
    try:
        check(value, "")
    except SpecError:
        return False
    if len(seen) >= 4096:
        seen.clear()
    seen.add(value)
    return True


def _new(cls, **fields):
    """A frozen dataclass made without its __init__, which sets each field through the slower
    object.__setattr__; every field must be given."""
    made = object.__new__(cls)
    made.__dict__.update(fields)
    return made


_ANYWHERE = Placement()  # shared by the plain jobs without a placement (nothing changes a Placement)
_TOP_SET, _METADATA_SET = frozenset(_TOP_FIELDS), frozenset(_METADATA_FIELDS)
_SPEC_SET, _POD_SET_SET = frozenset(_PLAIN_SPEC_FIELDS), frozenset(_POD_SET_FIELDS)
_PLACEMENT_SET = frozenset(_PLACEMENT_FIELDS)
_NAMES: set[str] = set()  # passed v.name
_DNS_LABELS: set[str] = set()  # passed v.dns_label
_LABEL_KEYS: set[str] = set()  # passed v.label_key
_SIM_VALUES: set[tuple] = set()  # (exit code, duration) annotations that passed _check_sim_annotations


# Kubernetes Job fields whose behaviour Sluice cannot give, refused rather than dropped (docs/api.md).
_PER_INDEX = "not supported: Sluice retries a Job's pods together, as a new attempt (use backoffLimit)"
_KUBERNETES_REFUSED = {
    "backoffLimitPerIndex": _PER_INDEX,
    "maxFailedIndexes": _PER_INDEX,
    "podFailurePolicy": "not supported: any failed pod fails the attempt, which Sluice retries as a whole up to "
                        "backoffLimit times",
    "successPolicy": "not supported: the attempt succeeds when every pod succeeded",
}
_COMPLETION_MODES = ("NonIndexed", "Indexed")


def _kubernetes_job(doc: dict, owned: bool = False) -> JobSpec:
    # Only the fields Sluice reads or refuses are checked: the rest of a Kubernetes Job (a TTL, a selector)
    # changes nothing of what runs, and is Kubernetes' business.
    metadata = v.mapping(doc.get("metadata"), "metadata")
    annotations = v.mapping(metadata.get("annotations"), "metadata.annotations")
    spec = v.mapping(doc.get("spec"), "spec", required=True)

    def annotation(key: str, check):
        return v.optional(check, annotations.get(key), f"metadata.annotations[{key}]")

    deadline = v.optional(v.integer, spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds", lo=1)
    template_path = "spec.template"
    template = v.mapping(v.required(spec, "template", "spec"), template_path)
    count = v.integer(v.get(spec, "parallelism", 1), "spec.parallelism", 1, MAX_POD_SET_COUNT)
    _check_gang_fields(spec, count)
    retries = v.optional(v.integer, spec.get("backoffLimit"), "spec.backoffLimit", lo=0)
    if retries is not None and retries > MAX_RETRIES:
        raise SpecError("spec.backoffLimit", f"{retries} is not supported: it becomes the job's maxRetries "
                                             f"(attempts after the first), at most {MAX_RETRIES}")
    return JobSpec(
        name=v.optional(v.string, metadata.get("name"), "metadata.name", max_len=MAX_NAME_LENGTH),
        labels=v.labels(metadata.get("labels"), "metadata.labels"),
        queue=annotation(QUEUE_ANNOTATION, v.name),
        service_class=annotation(SERVICE_CLASS_ANNOTATION, v.name),
        priority=annotation(PRIORITY_ANNOTATION, _priority_annotation) or 0,
        pod_sets=(_pod_set(KUBERNETES_POD_SET, count, template, template_path, owned),),
        placement=Placement(),
        max_retries=DEFAULT_MAX_RETRIES if retries is None else retries,
        max_runtime_s=None if deadline is None else float(deadline),
    )


def _check_gang_fields(spec: dict, count: int) -> None:
    """Refuse what a Kubernetes Job asks of its pods beyond one run of `count` pods together (a gang)."""
    completions = v.optional(v.integer, spec.get("completions"), "spec.completions", lo=1)
    if completions is not None and completions != count:
        raise SpecError("spec.completions", f"{completions} is not supported: Sluice runs a Job's pods once, all at "
                                            f"the same time (a gang); set completions to parallelism ({count}) "
                                            "or leave it out")
    mode = v.optional(v.choice, spec.get("completionMode"), "spec.completionMode", choices=_COMPLETION_MODES)
    if mode == "Indexed":
        raise SpecError("spec.completionMode", "'Indexed' is not supported: Sluice does not give every pod a "
                                               "completion index (JOB_COMPLETION_INDEX); leave it out or set "
                                               "NonIndexed")
    for field_name, why in _KUBERNETES_REFUSED.items():
        if spec.get(field_name) is not None:
            raise SpecError(f"spec.{field_name}", why)
    if v.optional(v.boolean, spec.get("suspend"), "spec.suspend"):
        raise SpecError("spec.suspend", "true is not supported: Sluice queues the job and starts it when it may "
                                        "run; submit it when it should")


def _priority_annotation(value: object, path: str) -> int:
    text = v.string(value, path)
    try:
        priority = int(text.strip())
    except ValueError:
        raise SpecError(path, f"must be an integer, got {text!r}") from None
    return v.integer(priority, path, MIN_PRIORITY, MAX_PRIORITY)


def _pod_sets(value: object, path: str, owned: bool = False) -> tuple[PodSet, ...]:
    pod_sets: list[PodSet] = []
    for i, raw in enumerate(v.items(value, path, non_empty=True, max_items=MAX_POD_SETS)):
        item_path = f"{path}[{i}]"
        item = v.mapping(raw, item_path, allowed=_POD_SET_FIELDS)
        name = v.dns_label(v.required(item, "name", item_path), f"{item_path}.name")
        if any(p.name == name for p in pod_sets):
            raise SpecError(f"{item_path}.name", f"pod set {name!r} is defined twice")
        count = v.integer(v.required(item, "count", item_path), f"{item_path}.count", 1, MAX_POD_SET_COUNT)
        template_path = f"{item_path}.template"
        template = v.mapping(v.required(item, "template", item_path), template_path)
        pod_sets.append(_pod_set(name, count, template, template_path, owned))
    pods = sum(p.count for p in pod_sets)
    if pods > MAX_PODS:
        raise SpecError(path, f"{pods} pods in total, at most {MAX_PODS} allowed")
    return tuple(pod_sets)


def _pod_set(name: str, count: int, template: dict, path: str, owned: bool = False) -> PodSet:
    _check_template_metadata(template, path)
    _check_sim_annotations(template, path)
    return PodSet(name=name, count=count, template=template if owned else json_copy(template),
                  requests=pod_requests(template, path))


def sim_exit_code(value: object) -> int:
    """The exit code `sluice.io/sim-exit-code` asks for: an integer from 0 to MAX_EXIT_CODE (a string, as
    annotations are, or an integer); raises ValueError saying what it must be."""
    text = str(value).strip() if type(value) in (str, int) else ""
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_EXIT_CODE:
        raise ValueError(f"must be an integer from 0 to {MAX_EXIT_CODE}, got {value!r}")
    return int(text)


def _check_template_metadata(template: dict, path: str) -> None:
    """The template's metadata, and its labels and annotations, are mappings where given: every agent puts
    Sluice's own beside them."""
    metadata = v.mapping(template.get("metadata"), f"{path}.metadata")
    for key in ("labels", "annotations"):
        v.mapping(metadata.get(key), f"{path}.metadata.{key}")


def _plain_metadata(template: dict) -> bool:
    """Whether _check_template_metadata passes, asked without wording an error."""
    metadata = template.get("metadata")
    if metadata is None:
        return True
    return type(metadata) is dict and all(type(metadata.get(key)) in (dict, type(None))
                                          for key in ("labels", "annotations"))


def _sim_annotations(template: dict) -> dict | None:
    """The template's annotations when it has any the sim backend reads, else None."""
    metadata = template.get("metadata")
    annotations = metadata.get("annotations") if type(metadata) is dict else None
    if type(annotations) is not dict or (SIM_EXIT_CODE_KEY not in annotations
                                         and SIM_DURATION_KEY not in annotations):
        return None
    return annotations


def _check_sim_values(values: tuple, path: str) -> None:
    exit_code, duration = values
    _check_sim_annotations({"metadata": {"annotations": {
        **({} if exit_code is None else {SIM_EXIT_CODE_KEY: exit_code}),
        **({} if duration is None else {SIM_DURATION_KEY: duration})}}}, path)


def _check_sim_annotations(template: dict, path: str) -> None:
    annotations = _sim_annotations(template)
    if annotations is None:
        return
    where = f"{path}.metadata.annotations"
    if SIM_EXIT_CODE_KEY in annotations:
        try:
            sim_exit_code(annotations[SIM_EXIT_CODE_KEY])
        except ValueError as exc:
            raise SpecError(f"{where}[{SIM_EXIT_CODE_KEY}]", str(exc)) from None
    if SIM_DURATION_KEY in annotations:
        v.duration(annotations[SIM_DURATION_KEY], f"{where}[{SIM_DURATION_KEY}]")


def _placement(value: object, path: str) -> Placement:
    placement = v.mapping(value, path, allowed=_PLACEMENT_FIELDS)
    return Placement(
        cluster_selector=v.labels(placement.get("clusterSelector"), f"{path}.clusterSelector"),
        tiers=v.strings(placement.get("tiers"), f"{path}.tiers", lambda x, p: v.choice(x, p, TIERS)),
        sites=v.strings(placement.get("sites"), f"{path}.sites"),
    )


# -- pod templates -----------------------------------------------------------------------------------

def pod_requests(template: dict, path: str = "template") -> dict[str, int]:
    """Effective requests of one pod of a PodTemplateSpec, in milli-units, as the Kubernetes scheduler
    counts them: max(sum over containers and sidecars, largest init container) plus pod overhead."""
    spec_path = f"{path}.spec"
    spec = v.mapping(v.required(template, "spec", path), spec_path)
    containers = _containers(spec.get("containers"), f"{spec_path}.containers", required=True)
    init_containers = _containers(spec.get("initContainers"), f"{spec_path}.initContainers", required=False)
    seen: set[str] = set()
    for container, container_path in init_containers + containers:
        if container["name"] in seen:
            raise SpecError(f"{container_path}.name", f"container {container['name']!r} is defined twice")
        seen.add(container["name"])

    running: dict[str, int] = {}
    for container, container_path in containers:
        running = add(running, _container_requests(container, container_path))
    # Init containers run one at a time, next to the sidecars (restartPolicy: Always) started before them;
    # sidecars then keep running next to the main containers.
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container, container_path in init_containers:
        requests = _container_requests(container, container_path)
        if container.get("restartPolicy") == "Always":
            sidecars = add(sidecars, requests)
            running = add(running, requests)
            init_peak = _maximum(init_peak, sidecars)
        else:
            init_peak = _maximum(init_peak, add(sidecars, requests))
    overhead = v.resources(spec.get("overhead"), f"{spec_path}.overhead")
    return add(_maximum(running, init_peak) if init_peak else running, overhead)


def _containers(value: object, path: str, *, required: bool) -> list[tuple[dict, str]]:
    out = []
    for i, raw in enumerate(v.items(value, path, non_empty=required)):
        container_path = f"{path}[{i}]"
        container = v.mapping(raw, container_path)
        v.string(v.required(container, "name", container_path), f"{container_path}.name")
        v.string(v.required(container, "image", container_path), f"{container_path}.image")
        out.append((container, container_path))
    return out


def _container_requests(container: dict, path: str) -> dict[str, int]:
    resources_path = f"{path}.resources"
    resources = v.mapping(container.get("resources"), resources_path)
    requests = v.resources(resources.get("requests"), f"{resources_path}.requests")
    limits = v.resources(resources.get("limits"), f"{resources_path}.limits")
    for resource, limit in limits.items():
        if resource not in requests:
            requests[resource] = limit  # Kubernetes defaults a missing request to the limit
        elif requests[resource] > limit:
            raise SpecError(f"{resources_path}.requests.{resource}",
                            f"must not exceed the limit ({format_quantity(resource, limit)})")
    return requests


def _maximum(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {resource: max(a.get(resource, 0), b.get(resource, 0)) for resource in {**a, **b}}
