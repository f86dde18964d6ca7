"""Schedules: recurring jobs. What the Schedules API calls (create, list, get, suspend, resume, delete, trigger)
and what the scheduling leader runs between cycles (`fire_due`).

Who may do what: a user sees and manages the schedules they created, an admin every one; any other is
NOT_FOUND, in the same words as one that does not exist. Creating one checks its job template as a submit
would (the queue exists, its owner may submit to it, the class is accepted): bad input changes nothing.

Each run is submitted as the schedule's owner (its subject and the role it had when it created the
schedule) through the submit path (submitting.SubmitConfig, lifecycle.submit), named
`<schedule>-<due time in epoch minutes>` and labelled `sluice.io/schedule: <schedule>`. A due time's job
goes in in the same transaction as the schedule's compare-and-set (store.schedules.advance): one job per due
time, across replicas and restarts. A run that cannot be submitted (its queue was deleted) is recorded on
the schedule as its last error and logged; that due time is handled, and the next one tried afresh.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from dispatcher.errors import Conflict, DispatcherError, InvalidRequest, NotFound, StoreUnavailable
from dispatcher.policy import schedules as policy
from dispatcher.policy.schedules import Run
from dispatcher.services import reporting
from dispatcher.services.submitting import SubmitConfig
from dispatcher.store import lifecycle
from dispatcher.store import schedules as store
from dispatcher.store.database import Session, Sessions
from dispatcher.store.models import Schedule
from dispatcher.store.schedules import RunRow
from dispatcher.store.tokens import Principal
from sluice._validate import SpecError
from sluice.schedules import ScheduleSpec, schedule_from_document
from sluice.spec import job_from_document

log = logging.getLogger(__name__)

MAX_DOCUMENT_BYTES = 1 << 20  # one Schedule document, as a job document
FIRE_LIMIT = 100  # schedules fired per pass of the leader; the others are next (earliest due first)


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as the API shows it."""

    name: str
    owner: str
    document: dict  # the canonical Schedule document
    suspended: bool
    last_scheduled_at: datetime | None
    next_due_at: datetime | None
    runs: tuple[RunRow, ...]  # the jobs it keeps track of, oldest first (policy.kept)
    status: str
    last_error: str | None
    last_error_at: datetime | None
    created_at: datetime

    @property
    def active_job_ids(self) -> tuple[int, ...]:
        return tuple(r.job_id for r in self.runs if not Run(r.job_id, r.state).final)


@dataclass(frozen=True)
class Triggered:
    schedule: ScheduleView
    job_id: int
    cancelled: tuple[int, ...]


def parse(document_json: str) -> ScheduleSpec:
    """The Schedule of a request's JSON document; InvalidRequest naming the field otherwise."""
    if len(document_json) > MAX_DOCUMENT_BYTES:
        raise InvalidRequest(f"schedule: {len(document_json)} bytes, at most {MAX_DOCUMENT_BYTES}")
    try:
        doc = json.loads(document_json)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidRequest(f"schedule: not JSON: {exc}") from None
    try:
        return schedule_from_document(doc)
    except SpecError as exc:
        raise InvalidRequest(f"schedule: {exc}") from None


def create(session: Session, who: Principal, document_json: str, now: datetime) -> ScheduleView:
    spec = parse(document_json)
    _check_template(session, who, spec)
    row = store.create(session, name=spec.name, owner=who.subject, owner_role=who.role, spec=spec.to_document(),
                       suspended=spec.suspend, next_due_at=policy.due_after(spec, now), created_at=now,
                       status="created suspended" if spec.suspend else "created")
    if row is None:
        raise Conflict(f"schedule {spec.name!r} already exists (delete it first to change it)")
    return _views(session, [row], now)[0]


def list_schedules(session: Session, who: Principal, now: datetime) -> list[ScheduleView]:
    return _views(session, store.list_schedules(session, None if who.role == "admin" else who.subject), now)


def get(session: Session, who: Principal, name: str, now: datetime) -> ScheduleView:
    return _views(session, [_visible(session, who, name)], now)[0]


def suspend(session: Session, who: Principal, name: str, now: datetime) -> ScheduleView:
    return _set_suspended(session, who, name, now, True)


def resume(session: Session, who: Principal, name: str, now: datetime) -> ScheduleView:
    """Due times that passed while suspended are not caught up, but for the latest within startingDeadline
    (no deadline: the latest), as after any downtime."""
    return _set_suspended(session, who, name, now, False)


def delete(session: Session, who: Principal, name: str, now: datetime) -> ScheduleView:
    """Delete a schedule; the jobs it started stay (Sluice never deletes jobs), running ones run on."""
    view = get(session, who, name, now)
    if not store.delete(session, name):
        raise NotFound(f"schedule {name!r} not found")
    return view


def trigger(session: Session, who: Principal, name: str, now: datetime) -> Triggered:
    """Start one run now, outside the due times, under the schedule's concurrency policy (Forbid refuses while
    a run is not final, Replace cancels it first), suspended or not. The due times are left as they were."""
    row = _visible(session, who, name)
    spec = _spec(row)
    ids, runs = _runs(session, row)
    decision = policy.trigger(spec, runs)
    if decision.refused is not None:
        raise Conflict(f"schedule {name!r}: not started: {decision.refused}")
    job_id = _start(session, row, spec, policy.run_name(name, now), decision.cancel)
    runs.append(Run(job_id, "QUEUED"))
    status = f"triggered by {who.subject}: started job {job_id}"
    if not store.advance(session, name, seen_at=row.last_scheduled_at, seen_ids=ids, due=row.last_scheduled_at,
                         next_due=row.next_due_at, job_ids=policy.kept(spec, runs), status=status):
        raise Conflict(f"schedule {name!r} changed while it was being triggered; try again")
    return Triggered(get(session, who, name, now), job_id, decision.cancel)


def fire_due(sessions: Sessions, now: datetime, limit: int = FIRE_LIMIT) -> int:
    """Fire every schedule with a due time at or before `now`, each in a short transaction of its own; how many
    jobs were started. A schedule whose firing fails is logged and tried again at the next pass; another
    dispatcher firing it meanwhile (a lost compare-and-set) is no failure."""
    with sessions.begin() as session:
        names = store.due_names(session, now, limit)
    started = 0
    for name in names:
        try:
            with sessions.begin() as session:
                started += fire(session, name, now)
        except StoreUnavailable:
            raise
        except Conflict:
            log.info("schedule fired by another dispatcher meanwhile", extra={"schedule": name})
        except Exception:
            log.exception("schedule firing failed", extra={"schedule": name})
    return started


def fire(session: Session, name: str, now: datetime) -> int:
    """Handle schedule `name`'s latest due time at or before `now`, if any: start its run or skip it (policy.fire),
    and record that, compare-and-set; 1 if a job was started. Raises Conflict, for the caller to roll back,
    when the schedule changed since it was read (another dispatcher fired it)."""
    row = store.get(session, name)
    if row is None or row.suspended:
        return 0
    spec = _spec(row)
    ids, runs = _runs(session, row)
    firing = policy.fire(spec, row.last_scheduled_at or row.created_at, now, runs)
    due, status, error, started = row.last_scheduled_at, firing.status or row.status, None, 0
    if firing.due is not None:
        due = firing.due
        if firing.start:
            try:
                job_id = _start(session, row, spec, policy.run_name(name, firing.due), firing.cancel)
            except StoreUnavailable:
                raise
            except DispatcherError as exc:
                error = status = f"due {policy.local(spec, firing.due)}: not started: {exc}"
                log.warning("schedule could not start its run", extra={"schedule": name, "due": firing.due.isoformat(),
                                                                       "error": str(exc)})
            else:
                runs.append(Run(job_id, "QUEUED"))
                status, started = status.replace(": started", f": started job {job_id}", 1), 1
                log.info("schedule started a run", extra={"schedule": name, "job_id": job_id,
                                                         "due": firing.due.isoformat()})
    if not store.advance(session, name, seen_at=row.last_scheduled_at, seen_ids=ids, due=due,
                         next_due=firing.next_due, job_ids=policy.kept(spec, runs), status=status, error=error,
                         error_at=now):
        raise Conflict(f"schedule {name!r} changed while it was being fired")
    return started


def _start(session: Session, row: Schedule, spec: ScheduleSpec, job_name: str, cancel: tuple[int, ...]) -> int:
    """Submit one run as the schedule's owner, having cancelled `cancel` (Replace): its job id. The run is
    validated before anything is cancelled, so a run that cannot start leaves the running one be."""
    owner = Principal(subject=row.owner, role=row.owner_role)
    try:
        job = job_from_document(spec.job_document(job_name))
    except SpecError as exc:
        raise InvalidRequest(f"spec.jobTemplate: {exc}") from None
    rows = SubmitConfig.read(session, {job.queue}).rows(owner, [job])
    if cancel:
        reporting.cancel(session, list(cancel), owner)
    return lifecycle.submit(session, rows)[0]


def _check_template(session: Session, who: Principal, spec: ScheduleSpec) -> None:
    """The template's run as a submit by `who` now would judge it; the error names spec.jobTemplate."""
    job = job_from_document(spec.job_document(policy.run_name(spec.name, datetime.fromtimestamp(0, UTC))))
    try:
        SubmitConfig.read(session, {job.queue}).rows(who, [job])
    except DispatcherError as exc:
        words = str(exc)
        raise type(exc)(f"schedule: spec.jobTemplate: {words.removeprefix('job: ')}") from None


def _visible(session: Session, who: Principal, name: str) -> Schedule:
    row = store.get(session, name)
    if row is None or (who.role != "admin" and row.owner != who.subject):
        raise NotFound(f"schedule {name!r} not found")
    return row


def _set_suspended(session: Session, who: Principal, name: str, now: datetime, suspended: bool) -> ScheduleView:
    _visible(session, who, name)
    store.set_suspended(session, name, suspended, f"{'suspended' if suspended else 'resumed'} by {who.subject}")
    return get(session, who, name, now)


def _spec(row: Schedule) -> ScheduleSpec:
    return schedule_from_document(row.spec)  # stored canonical: it reads back


def _runs(session: Session, row: Schedule) -> tuple[list[int], list[Run]]:
    """(the recent job ids as stored, the runs of those that exist, oldest first)."""
    ids = list(row.recent_job_ids)
    found = store.runs(session, ids)
    return ids, [Run(i, found[i].state) for i in ids if i in found]


def _views(session: Session, rows: list[Schedule], now: datetime) -> list[ScheduleView]:
    found = store.runs(session, sorted({i for row in rows for i in row.recent_job_ids}))
    out = []
    for row in rows:
        spec = _spec(row)
        since = max(row.last_scheduled_at or row.created_at, now)
        out.append(ScheduleView(
            name=row.name, owner=row.owner, document=row.spec, suspended=row.suspended,
            last_scheduled_at=row.last_scheduled_at, next_due_at=policy.due_after(spec, since),
            runs=tuple(found[i] for i in row.recent_job_ids if i in found), status=row.status,
            last_error=row.last_error, last_error_at=row.last_error_at, created_at=row.created_at))
    return out
