"""Accepting jobs: the server's authoritative validation of a Submit call's documents, and the rows to insert.

A submit is all-or-nothing: any invalid document rejects it and nothing is created. A submit is one
Submit call, or the requests of one on a SubmitStream (`more`), gathered by `Whole`, which numbers every
document by its place in the whole submit. `submit` validates and inserts one submit in the caller's
transaction; the API's concurrent calls go through group_commit.Submitter, which validates with the same
`SubmitConfig` and writes many submits in one transaction, each with its idempotency key.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import orjson

from dispatcher.capacity import usable
from dispatcher.errors import InvalidRequest, NotFound, PermissionDenied
from dispatcher.policy.placing import ClusterState, QueuedJob, impossible
from dispatcher.policy.sessions import order_priority
from dispatcher.services.admin_objects import default_class
from dispatcher.store import clusters as cluster_store
from dispatcher.store import copy_codec, job_reads, lifecycle
from dispatcher.store.database import Session
from dispatcher.store.tokens import Principal
from sluice._validate import NESTED_TOO_DEEP, check_depth, unstorable_at
from sluice.spec import JobSpec, SpecError, job_from_document

MAX_BATCH = 10_000  # jobs per Submit request
MAX_SUBMIT = 100_000  # jobs per submit, across its requests on a stream (held in memory until the last)
MAX_KEY_CHARS = 200  # an idempotency key
MAX_SPEC_BYTES = 1 << 20  # one job document


# orjson decodes a document 3x faster than `json` and, for what both take, to the same values, except an
# integer past 64 bits (orjson makes it a float) and nesting `json` refuses (RecursionError): documents that
# may hold either go to `json` (19 digits in a row, or 400 brackets: all but never). orjson refuses NaN,
# Infinity, 1E400 and lone surrogates, which `json` takes: it decodes those documents too, and words
# every error.
_DIGITS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))  # bytes.translate: each digit to "0", else " "
_LONG_NUMBER = b"0" * 19
_FEW_BRACKETS = 400


def _decode(document: str) -> tuple[object, bool]:
    """(the decoded document, whether `json` decoded it); raises json.JSONDecodeError as `json` does."""
    try:
        data = document.encode()
    except UnicodeEncodeError:  # a lone surrogate: never from gRPC, which sends UTF-8
        data = None
    if (data is not None and data.count(b"{") + data.count(b"[") < _FEW_BRACKETS
            and _LONG_NUMBER not in data.translate(_DIGITS)):
        try:
            return orjson.loads(data), False
        except orjson.JSONDecodeError:
            pass
    return json.loads(document), True


class Undecodable(ValueError):
    """A job document's text that is not one it can be: its words say why."""


def decode(document: str) -> tuple[dict, bool]:
    """A job document's JSON text as its object, and whether `json` (not orjson) decoded it; Undecodable when
    it is too long, not JSON, not an object, nested too deep, or holds what Postgres cannot store."""
    if len(document) > MAX_SPEC_BYTES:
        raise Undecodable(f"{len(document)} bytes, at most {MAX_SPEC_BYTES}")
    try:
        doc, by_json = _decode(document)
    except json.JSONDecodeError as exc:
        raise Undecodable(f"not JSON: {exc}") from None
    except RecursionError:
        raise Undecodable(NESTED_TOO_DEEP) from None
    if not isinstance(doc, dict):
        raise Undecodable("expected a JSON object")
    # Postgres cannot store a NUL in jsonb, nor a lone surrogate (which only `json` decodes) anywhere.
    if ("\\u0000" in document or by_json) and (bad := unstorable_at(doc)) is not None:
        raise Undecodable(f"{bad[0] or 'document'}: {bad[1]}")
    try:
        check_depth(doc, document)
    except SpecError as exc:
        raise Undecodable(str(exc)) from None
    return doc, by_json


class _ExactJSON(list):
    """The specs of a call with a document only `json` decoded: its rows' documents are encoded by `json`
    too (store.copy_codec.ExactJSON), so values orjson would write otherwise (NaN as null) reach Postgres as
    before."""


def parse(specs_json: list[str], *, first: int = 1, numbered: bool | None = None) -> list[JobSpec]:
    """The jobs of one request's documents. first: the place of its first document in its submit (a later
    request of a submit on a stream); numbered: whether errors name the document by that place (by default
    when the request holds several)."""
    if not specs_json:
        raise InvalidRequest("submit: no jobs given")
    if len(specs_json) > MAX_BATCH:
        raise InvalidRequest(f"submit: {len(specs_json)} jobs in one request, at most {MAX_BATCH}")
    numbered = len(specs_json) > 1 if numbered is None else numbered
    out, exact = [], False
    for n, document in enumerate(specs_json, first):
        try:
            doc, by_json = decode(document)
        except Undecodable as exc:
            raise InvalidRequest(f"document {n}: {exc}") from None
        exact = exact or by_json
        try:
            out.append(job_from_document(doc, document=n if numbered else None, owned=True))
        except SpecError as exc:
            raise InvalidRequest(str(exc)) from exc
    return _ExactJSON(out) if exact else out


class Whole:
    """One submit gathered from its requests: the jobs of all, in order, and its idempotency key with a
    digest of every document as sent (so that a retry is recognised however its requests split them)."""

    def __init__(self, key: str, parse: Callable[..., list[JobSpec]] = parse):
        if len(key) > MAX_KEY_CHARS:
            raise InvalidRequest(f"idempotency_key: {len(key)} characters, at most {MAX_KEY_CHARS}")
        self.key = key
        self._parse = parse
        self._parts: list[list[JobSpec]] = []
        self._count = 0
        self._hash = hashlib.sha256()

    def add(self, specs_json: list[str], *, more: bool) -> None:
        """Parse one request's documents; `more`: others of this submit follow."""
        if self._count + len(specs_json) > MAX_SUBMIT:
            raise InvalidRequest(f"submit: more than {MAX_SUBMIT:,} jobs in one submit; split the file")
        numbered = True if more or self._parts else None
        self._parts.append(self._parse(specs_json, first=self._count + 1, numbered=numbered))
        if self.key:
            if self._parts[1:]:
                self._hash.update(b"\0")
            self._hash.update("\0".join(specs_json).encode(errors="surrogatepass"))  # NUL: never raw in JSON
        self._count += len(specs_json)

    @property
    def count(self) -> int:
        """Jobs added so far."""
        return self._count

    @property
    def digest(self) -> str:
        return self._hash.hexdigest() if self.key else ""

    def specs(self) -> list[JobSpec]:
        if len(self._parts) == 1:
            return self._parts[0]
        joined = [spec for part in self._parts for spec in part]
        return _ExactJSON(joined) if any(isinstance(part, _ExactJSON) for part in self._parts) else joined


def submit(session: Session, principal: Principal, specs: list[JobSpec]) -> list[int]:
    """Validate and insert one call's jobs in the caller's transaction; returns their ids."""
    return lifecycle.submit(session, SubmitConfig.read(session, {s.queue for s in specs}).rows(principal, specs))


class SubmitConfig:
    """What validating a job reads: the service classes, the queues it names, every cluster's allocatable."""

    def __init__(self, classes: dict[str, int], queues: dict[str, dict], reported: list[ClusterState],
                 unreported: list[str]):
        self.classes = classes  # name -> priority
        self.queues = queues  # name -> the Queue object's spec
        self.reported = reported  # the clusters whose agents have reported capacity
        self.unreported = unreported  # the names of those that never have
        # Every cluster, once all have reported (a job none could run is refused); else None, and a job no
        # reported cluster could run is accepted with a reason that says so.
        self.known = reported if reported and not unreported else None
        self._shapes: dict[tuple, tuple[dict, dict, dict, str | None, list | None, str | None]] = {}  # see _shape
        self._labels: dict[tuple, dict[str, str]] = {}  # one object per distinct labels, shared by jobs
        self.seen: tuple[int | None, list | None] = (None, None)
        self.found: dict[str, dict] = {}  # name -> the Queue object as read, of the queues named

    def forget_if_large(self) -> None:
        """Drop the shapes and labels kept once there are many: a config kept from write to write
        (group_commit.Submitter) would otherwise keep every one ever submitted."""
        if len(self._shapes) + len(self._labels) > 10_000:
            self._shapes, self._labels = {}, {}

    @classmethod
    def read(cls, session: Session, queues: set[str],
             seen: tuple[int | None, tuple | None] | None = None) -> SubmitConfig:
        """One round trip. seen: (version, clusters) of an earlier read, reused while the version read in
        this transaction is unchanged (the clusters' documents are then neither built, sent nor parsed)."""
        classes, found, version, clusters = cluster_store.submit_config(session, queues, seen[0] if seen else None)
        if clusters is None:
            reported, unreported = seen[1]
        else:
            reported, unreported = [], []
            for name, tier, site, labels, spec, allocatable in clusters:
                if allocatable is None:
                    unreported.append(name)
                else:
                    reported.append(ClusterState(name, tier, site, dict(labels), allocatable, dict(allocatable),
                                                 **usable.terms(spec, allocatable)))
        config = cls(classes, {name: (spec or {}).get("spec", {}) for name, spec in found.items()}, reported,
                     unreported)
        config.seen, config.found = (version, (reported, unreported)), found
        return config

    def rows(self, principal: Principal, specs: list[JobSpec]) -> list[lifecycle.NewJob]:
        """The rows to insert for one call's jobs; raises for the first that may not be submitted."""
        out = []
        admitted: dict[tuple[str | None, str | None], str] = {}  # (queue, class asked for) -> class, checked
        exact = isinstance(specs, _ExactJSON)
        for n, spec in enumerate(specs, 1):
            asked = (spec.queue, spec.service_class)
            class_name = admitted.get(asked)
            if class_name is None:
                class_name = admitted[asked] = self._admit(principal, spec,
                                                           f"document {n}" if len(specs) > 1 else "job")
            requests, largest, placement, why, pods, note = self._shape(spec)
            if why:
                raise InvalidRequest(f"{f'document {n}' if len(specs) > 1 else 'job'}: {why}")
            labels = self._labels.setdefault(tuple(spec.labels.items()), spec.labels)
            doc = spec.to_document(share_templates=True)  # only serialised, never changed below the top
            doc["spec"]["serviceClass"] = class_name
            doc["spec"]["placement"] = placement
            if exact:
                doc = copy_codec.ExactJSON(doc)
            out.append(lifecycle.NewJob(
                name=spec.name, queue=spec.queue, service_class=class_name, class_priority=self.classes[class_name],
                priority=order_priority(spec.priority, spec.interactive), max_retries=spec.max_retries, spec=doc,
                requests=requests, largest_pod=largest, placement=placement, labels=labels,
                submitted_by=principal.subject, pods=pods, reason=note))
        return out

    def _admit(self, principal: Principal, spec: JobSpec, where: str) -> str:
        """The service class a job runs in, once its queue, the principal's membership and the class are
        checked; raises what stops it."""
        qspec = self.queues.get(spec.queue)
        if qspec is None:
            raise NotFound(f"{where}: spec.queue: queue {spec.queue!r} not found")
        members = qspec.get("members") or []
        if principal.role != "admin" and members and not principal.belongs(spec.queue, members):
            raise PermissionDenied(f"{where}: {principal.subject} may not submit to queue {spec.queue!r}")
        listed = qspec.get("serviceClasses") or []
        accepted = listed or sorted(self.classes)
        class_name = spec.service_class or self._default_class(listed)
        if class_name not in self.classes:
            raise NotFound(f"{where}: spec.serviceClass: service class {class_name!r} not found")
        if class_name not in accepted:
            raise InvalidRequest(f"{where}: spec.serviceClass: queue {spec.queue!r} accepts only "
                                 f"{', '.join(accepted)}")
        return class_name

    def _shape(self, spec: JobSpec) -> tuple[dict, dict, dict, str | None, list | None, str | None]:
        """(requests, largest pod, placement document, why no cluster could ever run it, the pods as
        placement packs them: [[count, per-pod requests], ...], None for one pod, the reason it is accepted
        with when no cluster that has reported could run it but some have not reported), judged once per
        job shape and placement. Jobs of one shape share these objects, so each is encoded once per write.
        The shape is the pod sets' counts and per-pod requests as given (summing them for every job cost more
        than the rest of judging it)."""
        p = spec.placement
        key = (tuple((ps.count, *ps.requests.items()) for ps in spec.pod_sets),
               tuple(sorted(p.cluster_selector.items())), p.tiers, p.sites)
        shape = self._shapes.get(key)
        if shape is None:
            requests, largest = spec.total_requests(), spec.largest_pod()
            why = note = None
            if self.reported:
                job = QueuedJob(0, requests, largest, dict(p.cluster_selector), tuple(p.tiers), tuple(p.sites))
                # No pods: `impossible` judges clusters as if empty, without their nodes' figures.
                why = impossible(job, self.reported)
                if why is not None and self.unreported:
                    note, why = unreported_note(why, self.unreported), None
            placement = {"clusterSelector": dict(p.cluster_selector), "tiers": list(p.tiers), "sites": list(p.sites)}
            pods = [[ps.count, ps.requests] for ps in spec.pod_sets] if spec.pod_count() > 1 else None
            shape = self._shapes[key] = (requests, largest, placement, why, pods, note)
        return shape

    def _default_class(self, listed: list[str]) -> str:
        return default_class(listed, self.classes)


def unreported_note(why: str, unreported: list[str]) -> str:
    """The reason of a job accepted because clusters that have not reported might run it."""
    names = ", ".join(unreported[:5]) + (f" and {len(unreported) - 5} more" if len(unreported) > 5 else "")
    which = "which has" if len(unreported) == 1 else "which have"
    return (why.replace("no cluster could ever run it:", "no cluster that has reported could ever run it:", 1)
            + f"; refused unless {names}, {which} not reported yet, can")


REFUSED = "refused once every cluster had reported: "


def refuse_impossible(session: Session) -> list[int]:
    """Once every cluster has reported, refuse (cancel) the queued jobs none could ever run: those accepted
    while some had not (see unreported_note), as a submit is refused now. Their ids."""
    config = SubmitConfig.read(session, set())
    if config.known is None:
        return []
    refused = []
    for requests, largest, placement, ids in job_reads.queued_shapes(session):
        job = QueuedJob(0, requests, largest, dict(placement.get("clusterSelector") or {}),
                        tuple(placement.get("tiers") or ()), tuple(placement.get("sites") or ()))
        why = impossible(job, config.known)
        if why is not None:
            refused += lifecycle.refuse_queued(session, ids, REFUSED + why)
    return refused


