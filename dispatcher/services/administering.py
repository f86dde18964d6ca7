"""Administering Sluice: applying, reading and deleting admin objects, the quota and membership
shortcuts, tokens and cluster states. Every change writes an audit record in the caller's transaction.

Each object is parsed and checked on its own by sluice.objects. This module adds the checks that need
the other objects: a queue's parent exists and the queues form no cycle, a child's guarantee fits in
its parent's, the children's guarantees together too, the service classes and queues an object names
exist. They are evaluated on the stored objects merged with the whole applied set, so a set of objects
is accepted or refused as a whole, and only problems that involve an object being changed refuse it.
Admin changes are serialised by one advisory lock, so each is checked against what is committed.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import yaml

from dispatcher.errors import Conflict, InvalidRequest, NotFound
from dispatcher.policy import states
from dispatcher.services.admin_objects import Key, object_problems
from dispatcher.store import admin as admin_store
from dispatcher.store import channels, tokens
from dispatcher.store import clusters as cluster_store
from dispatcher.store.database import Session
from dispatcher.store.models import ApiToken, AuditRecord, RevokedCertificate
from sluice._validate import unstorable_at
from sluice.documents import json_document
from sluice.objects import KINDS, AdminObject, kind_named, object_from_document
from sluice.spec import SpecError

WORDS = {"Queue": "queue", "ServiceClass": "service class", "Cluster": "cluster", "BurstPolicy": "burst policy"}
CLUSTER_STATES = {"active": "uncordon", "cordoned": "cordon", "draining": "drain"}  # state: its audit action
# Tables whose foreign keys name admin objects, as a message says them (one, many).
REFERRING = {"jobs": ("job", "jobs"), "attempts": ("attempt", "attempts"),
             "outbox": ("outbox command", "outbox commands"), "api_tokens": ("token", "tokens"),
             "queues": ("child queue", "child queues")}
MAX_AUDIT = 1000
MAX_SERIAL_DIGITS = 40  # a certificate serial number is at most 20 octets (RFC 5280)
MAX_EXPIRES_S = 100 * 365 * 86400  # the longest life a token may be given (0: it never expires)


@dataclass(frozen=True)
class Change:
    kind: str
    name: str
    action: str  # create | update | unchanged
    diff: str  # unified diff of the YAML before and after; "" when unchanged
    document: dict  # the object after the change


def resolve_kind(text: str) -> str:
    kind = kind_named(text)
    if kind is None:
        raise InvalidRequest(f"kind: unknown kind {text!r}, known: {', '.join(sorted(KINDS))}")
    return kind


def parse(documents_json: list[str]) -> list[AdminObject]:
    """The objects of an Apply call, each checked on its own; errors name the 1-based document."""
    if not documents_json:
        raise InvalidRequest("apply: no objects given")
    objects: list[AdminObject] = []
    seen: dict[Key, int] = {}
    for n, text in enumerate(documents_json, 1):
        try:
            doc = json_document(text)
            if "\\u" in text and (bad := unstorable_at(doc)) is not None:
                raise SpecError(*bad)
            obj = object_from_document(doc, document=n)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"document {n}: not JSON: {exc}") from exc
        except SpecError as exc:
            exc.document = exc.document or n
            raise InvalidRequest(str(exc)) from exc
        key = (obj.kind, obj.name)
        if key in seen:
            raise InvalidRequest(f"document {n}: {WORDS[obj.kind]} {obj.name} is also document {seen[key]}")
        seen[key] = n
        objects.append(obj)
    return objects


def apply(session: Session, actor: str, objects: list[AdminObject], *, dry_run: bool = False,
          numbered: bool = True) -> list[Change]:
    """Create or update objects, all or nothing; a dry run only says what would change. numbered: an error
    names the object's place in the set (a file's document), else the object alone."""
    admin_store.serialize(session)
    return _apply(session, actor, _stored(session), objects,
                  {(o.kind, o.name): n if numbered else None for n, o in enumerate(objects, 1)}, dry_run=dry_run)


def get(session: Session, kind: str, name: str = "") -> list[dict]:
    """Canonical documents of the stored objects of one kind (every kind when kind is ""), or of one object."""
    if not kind and name:
        raise InvalidRequest("kind: required with a name")
    canonical = resolve_kind(kind) if kind else None
    # Re-read into objects: JSONB keeps no key order, the canonical document has docs/api.md's.
    stored = admin_store.documents(session, canonical, name or None)
    docs = [object_from_document(doc).to_document() for _, doc in stored]
    if name and not docs:
        raise NotFound(f"{WORDS[canonical]} {name!r} not found")
    return docs


def delete(session: Session, actor: str, kind: str, name: str) -> dict:
    """Delete an object nothing uses; returns its document. Refused, saying why, while it is in use."""
    kind = resolve_kind(kind)
    admin_store.serialize(session)
    doc = admin_store.lock(session, kind, name)
    if doc is None:
        raise NotFound(f"{WORDS[kind]} {name!r} not found")
    uses = _uses(session, kind, name)
    if uses:
        raise Conflict(f"{WORDS[kind]} {name} is in use: {', '.join(uses)}")
    refs = admin_store.references(session, kind, name)
    if refs:
        listed = ", ".join(f"{n} {REFERRING.get(table, (table, table))[n != 1]}" for table, n in refs.items())
        hint = "; cordon it instead" if kind == "Cluster" else ""
        raise Conflict(f"{WORDS[kind]} {name} cannot be deleted: still referred to by {listed}{hint}")
    admin_store.delete_object(session, kind, name)
    _record(session, actor, "delete", kind, name, {"before": doc, "after": None})
    return doc


def set_quota(session: Session, actor: str, queue: str, guaranteed: dict[str, str],
              maximum: dict[str, str]) -> Change:
    """Merge quantities into a queue's guaranteed and max ("" removes a resource), checked like apply."""
    if not guaranteed and not maximum:
        raise InvalidRequest("quota: no resources given")

    def merge(spec: dict) -> None:
        for field, values in (("guaranteed", guaranteed), ("max", maximum)):
            merged = dict(spec.get(field) or {})
            for resource, amount in values.items():
                if amount == "":
                    merged.pop(resource, None)
                else:
                    merged[resource] = amount
            spec[field] = merged
    return _edit_queue(session, actor, queue, "quota-set", merge)


def add_member(session: Session, actor: str, queue: str, user: str) -> Change:
    """Let `user` submit to `queue` (a queue that lists no members is open to everyone until then)."""
    if not user:
        raise InvalidRequest("user: required")

    def merge(spec: dict) -> None:
        members = list(spec.get("members") or [])
        spec["members"] = members if user in members else [*members, user]
    return _edit_queue(session, actor, queue, "add-member", merge)


def create_token(session: Session, actor: str, role: str, subject: str, cluster: str, expires_s: int,
                 now: datetime) -> tuple[int, str]:
    """A new token: (id, secret). Agent tokens, and only they, are bound to an existing cluster."""
    if role not in tokens.ROLES:
        raise InvalidRequest(f"role: must be one of {', '.join(tokens.ROLES)}, got {role!r}")
    if not subject:
        raise InvalidRequest("subject: required")
    if (role == "agent") != bool(cluster):
        raise InvalidRequest("cluster: required for agent tokens and only for them")
    if not 0 <= expires_s <= MAX_EXPIRES_S:
        raise InvalidRequest(f"expires_seconds: must be from 0 (never) to {MAX_EXPIRES_S} (100 years)")
    if cluster:
        require_cluster(session, cluster)
    expires_at = now + timedelta(seconds=expires_s) if expires_s else None
    token_id, secret = tokens.issue(session, role, subject, cluster or None, expires_at)
    _record(session, actor, "create", "Token", str(token_id), {
        "role": role, "subject": subject, "cluster": cluster or None,
        "expiresAt": expires_at.isoformat() if expires_at else None})
    return token_id, secret


def require_cluster(session: Session, cluster: str) -> None:
    """The cluster an agent token is to be bound to exists; else NotFound naming the commands that define one."""
    try:
        cluster_store.get_cluster(session, cluster)
    except NotFound as exc:
        raise NotFound(f"cluster {cluster!r} not found: an agent token is bound to a defined cluster; define it "
                       f"first with `sluice admin apply -f FILE` (a Cluster object) or `sluice up --config FILE`") \
            from exc


def revoke_token(session: Session, actor: str, token_id: int) -> tuple[ApiToken, bool]:
    """Revoke a token; (token, whether this call revoked it). Every replica drops its cached tokens when
    this commits (store.tokens.revoke notifies), and streams open with it end."""
    row, revoked = tokens.revoke(session, token_id)
    if revoked:
        _record(session, actor, "revoke", "Token", str(token_id), {"role": row.role, "subject": row.subject})
    return row, revoked


def revoke_certificate(session: Session, actor: str, serial: str, cluster: str = "",
                       not_after: datetime | None = None) -> tuple[RevokedCertificate, bool]:
    """Revoke an agent's client certificate by serial number (hex, any case, colons allowed); (the
    revocation, whether this call made it). Every replica refuses it within moments of the commit, and the
    links open with it end (store.tokens.revoke_certificate notifies)."""
    digits = serial.strip().lower().removeprefix("0x").replace(":", "")
    if not digits or len(digits) > MAX_SERIAL_DIGITS or any(c not in "0123456789abcdef" for c in digits):
        raise InvalidRequest(f"serial: {serial[:60]!r} is not a certificate serial number (hex digits, at most "
                             f"{MAX_SERIAL_DIGITS}, colons allowed)")
    digits = digits.lstrip("0") or "0"
    row, revoked = tokens.revoke_certificate(session, digits, cluster or None, not_after)
    if revoked:
        _record(session, actor, "revoke", "Certificate", digits, {"cluster": cluster or None})
    return row, revoked


def set_cluster_state(session: Session, actor: str, name: str, state: str) -> str:
    """Cordon, drain or uncordon a cluster (only an active one gets new jobs); returns the state it had."""
    if state not in CLUSTER_STATES:
        raise InvalidRequest(f"state: must be one of {', '.join(CLUSTER_STATES)}, got {state!r}")
    admin_store.serialize(session)
    previous = cluster_store.set_state(session, name, state)
    if previous != state:
        _record(session, actor, CLUSTER_STATES[state], "Cluster", name, {"state": state, "previousState": previous})
    return previous


def audit(session: Session, *, limit: int = 0, after_id: int = 0) -> list[AuditRecord]:
    if limit < 0 or after_id < 0:
        raise InvalidRequest("limit and after_id must not be negative")
    return admin_store.audit(session, limit=min(limit or 100, MAX_AUDIT), after_id=after_id)


# -- internals ---------------------------------------------------------------------------------------
def _stored(session: Session) -> dict[Key, AdminObject]:
    return {(kind, doc["metadata"]["name"]): object_from_document(doc) for kind, doc in admin_store.documents(session)}


def _record(session: Session, actor: str, action: str, kind: str, name: str, details: dict) -> None:
    admin_store.record(session, actor, action, kind, name, details)
    channels.notify(session, channels.WAKE_CHANNEL)  # quotas, classes or clusters changed: schedule again


def _edit_queue(session: Session, actor: str, name: str, action: str, edit) -> Change:
    admin_store.serialize(session)
    stored = _stored(session)
    queue = stored.get(("Queue", name))
    if queue is None:
        raise NotFound(f"queue {name!r} not found")
    doc = queue.to_document()
    edit(doc["spec"])
    try:
        edited = object_from_document(doc)
    except SpecError as exc:
        raise InvalidRequest(f"queue {name}: {exc}") from exc
    return _apply(session, actor, stored, [edited], {("Queue", name): None}, action=action)[0]


def _apply(session: Session, actor: str, stored: dict[Key, AdminObject], objects: list[AdminObject],
           documents: dict[Key, int | None], *, dry_run: bool = False, action: str | None = None) -> list[Change]:
    """Check `objects` against `stored` merged with them, then write those that changed.

    `documents` maps each applied object to its 1-based document number (None: not from a document),
    for error messages.
    """
    merged = dict(stored)
    merged.update({(o.kind, o.name): o for o in objects})
    for involved, message in object_problems(merged):
        touched = [key for key in involved if key in documents]
        if touched:
            number = documents[touched[0]]
            raise InvalidRequest(f"document {number}: {message}" if number else message)
    changes = []
    for obj in objects:
        before = stored.get((obj.kind, obj.name))
        after = obj.to_document()
        if before is None:
            changes.append(Change(obj.kind, obj.name, "create", _diff(None, after, obj.name), after))
        elif before == obj:
            changes.append(Change(obj.kind, obj.name, "unchanged", "", after))
        else:
            changes.append(Change(obj.kind, obj.name, "update", _diff(before.to_document(), after, obj.name), after))
    if dry_run:
        return changes
    changed = [o for o, c in zip(objects, changes, strict=True) if c.action != "unchanged"]
    cluster_store.apply_objects(session, changed)
    for obj, change in zip(objects, changes, strict=True):
        if change.action != "unchanged":
            before = stored.get((obj.kind, obj.name))
            _record(session, actor, action or change.action, obj.kind, obj.name,
                    {"before": before.to_document() if before else None, "after": change.document})
    return changes


def _diff(before: dict | None, after: dict, name: str) -> str:
    def lines(doc):
        return yaml.safe_dump(doc, sort_keys=False).splitlines(keepends=True) if doc is not None else []
    label = f"{after['kind']}/{name}"
    return "".join(difflib.unified_diff(lines(before), lines(after), fromfile=label if before else "/dev/null",
                                        tofile=label))


def _uses(session: Session, kind: str, name: str) -> list[str]:
    """Why an object may not be deleted now: unfinished jobs, and other objects that name it."""
    jobs = admin_store.job_states(session, kind, name)
    # A cluster is used by the jobs running there; a queue or class by every job not finished.
    cluster = kind == "Cluster"
    blocking, how = (states.ACTIVE, "active") if cluster else (states.ACTIVE | {states.QUEUED}, "not finished")
    busy = sum(n for state, n in jobs.items() if state in blocking)
    out = [f"{busy} {'job' if busy == 1 else 'jobs'} {how}"] if busy else []
    if kind not in ("Queue", "ServiceClass"):
        return out
    objects = list(_stored(session).values())
    queues = [o for o in objects if o.kind == "Queue"]
    if kind == "Queue":
        children = [q.name for q in queues if q.parent == name]
        if children:
            out.append(_listing("child queue", "child queues", children))
    else:
        accepting = [q.name for q in queues if name in q.service_classes]
        if accepting:
            out.append("named by " + _listing("queue", "queues", accepting))
    policies = [p.name for p in objects
                if p.kind == "BurstPolicy" and name in (p.queues if kind == "Queue" else p.service_classes)]
    if policies:
        out.append("named by " + _listing("burst policy", "burst policies", policies))
    return out


def _listing(one: str, many: str, names: list[str]) -> str:
    """'child queue cv', 'child queues cv, nlp'."""
    return f"{one if len(names) == 1 else many} {', '.join(sorted(names))}"
