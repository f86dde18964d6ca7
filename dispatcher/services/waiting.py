"""Jobs that wait and job arrays: submitting them, and the leader's pass that queues them when their time,
their dependencies or a slot of their array comes (policy/holding.py has the rules).

A submit that has any job with startAfter, dependsOn or an array comes here rather than to group_commit:
it is validated as any submit (SubmitConfig), its dependencies are resolved (a name is a job of the same
submit, else the newest job of that name its user submitted; an id must be a job its user may see), a
cycle among its jobs is refused naming them, each array becomes its elements, and all of it is written in
one transaction with its idempotency key.
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher.errors import InvalidRequest, NotFound
from dispatcher.policy import holding, states
from dispatcher.policy.holding import ARRAY, Target
from dispatcher.services import scoping
from dispatcher.services.submitting import SubmitConfig
from dispatcher.store import holds, job_reads, lifecycle, submit_keys
from dispatcher.store.database import Session
from dispatcher.store.tokens import Principal
from sluice.spec import CONDITIONS, JobSpec

log = logging.getLogger(__name__)


def submit(session: Session, principal: Principal, specs: list[JobSpec], now: datetime,
           keys: list[submit_keys.NewKey] = ()) -> list[int]:
    """Validate and write one submit that has waiting jobs or arrays, in the caller's transaction; the ids of
    its jobs (every element of an array), in order. `keys`: its idempotency key, for all of its jobs."""
    config = SubmitConfig.read(session, {s.queue for s in specs})
    rows = config.rows(principal, specs)
    where = _places(specs)
    edges = _dependencies(session, principal, specs, where)
    jobs: list[lifecycle.NewJob] = []
    first_of: list[int] = []  # per document, the place of its (first) job
    arrays: list[lifecycle.NewArray] = []
    for spec, row in zip(specs, rows):
        first_of.append(len(jobs))
        start_after = (spec.start_after if isinstance(spec.start_after, datetime) or spec.start_after is None
                       else now + timedelta(seconds=spec.start_after))
        hold = holding.next_hold(after=None, start_after=start_after, now=now, unmet=bool(spec.depends_on),
                                 array_limited=False)
        row.start_after = start_after
        if spec.array is None:
            row.state, row.hold = (states.WAITING, hold) if hold else (states.QUEUED, None)
            jobs.append(row)
            continue
        array = spec.array
        slots = array.count if array.parallelism is None else array.parallelism
        arrays.append(lifecycle.NewArray(len(jobs), array.count, array.parallelism, array.first,
                                         waiting=hold is None and array.count > slots))
        for k in range(array.count):
            element = copy.copy(row)
            element.array_of, element.array_index = first_of[-1], array.first + k
            element_hold = hold or (ARRAY if k >= slots else None)
            element.state, element.hold = (states.WAITING, element_hold) if element_hold else (states.QUEUED, None)
            jobs.append(element)
    ids = lifecycle.draw_ids(session, jobs)
    dependencies = [lifecycle.NewDependency(first_of[doc] + k, first_of[on] if within else on, within, condition)
                    for doc, doc_edges in edges.items() for on, within, condition in doc_edges
                    for k in range(_size(specs[doc]))]
    target_ids = {doc: [ids[first_of[on]] if within else on for on, within, _ in doc_edges]
                  for doc, doc_edges in edges.items()}
    for doc, spec in enumerate(specs):
        reasons: dict[str, str] = {}  # by hold: one string for all of an array's elements
        for job in jobs[first_of[doc]:first_of[doc] + _size(spec)]:
            if job.hold is None:
                continue
            if job.hold not in reasons:
                reasons[job.hold] = holding.waiting_reason(
                    job.hold, start_after=job.start_after, array_id=ids[first_of[doc]],
                    parallelism=spec.array.parallelism if spec.array else None,
                    unmet=[(on, d.condition) for on, d in zip(target_ids.get(doc, ()), spec.depends_on)])
            job.reason = reasons[job.hold]
    return lifecycle.submit_waiting(session, ids, jobs, dependencies, arrays, keys)


def _size(spec: JobSpec) -> int:
    return spec.array.count if spec.array is not None else 1


def _places(specs: list[JobSpec]):
    """How errors name a document: 'document 2' in a submit of several, 'job' alone."""
    return (lambda n: f"document {n + 1}") if len(specs) > 1 else (lambda n: "job")


def _dependencies(session: Session, principal: Principal, specs: list[JobSpec],
                  where) -> dict[int, list[tuple[int, bool, str]]]:
    """Per document, its dependencies resolved: (document, True, condition) for a job of this submit,
    (job id, False, condition) for one before it. Raises for a name or id not found (or not visible) and
    for a cycle among the submit's jobs."""
    named: dict[str, list[int]] = {}
    for n, spec in enumerate(specs):
        if spec.name is not None:
            named.setdefault(spec.name, []).append(n)
    edges: dict[int, list[tuple[int, bool, str]]] = {}
    for n, spec in enumerate(specs):
        for k, dependency in enumerate(spec.depends_on):
            path = f"{where(n)}: spec.dependsOn[{k}].job"
            job = dependency.job
            if isinstance(job, str) and job in named:
                if len(named[job]) > 1:
                    raise InvalidRequest(f"{path}: {len(named[job])} documents of this submit are named {job!r}; "
                                         "name each once")
                edges.setdefault(n, []).append((named[job][0], True, dependency.condition))
                continue
            if isinstance(job, str):
                found = job_reads.newest_named(session, job, principal.subject)
                if found is None:
                    raise NotFound(f"{path}: no job named {job!r} in this submit or submitted by "
                                   f"{principal.subject}")
                job = found
            try:
                scoping.visible_job(session, principal, job)
            except NotFound:
                raise NotFound(f"{path}: job {job} not found") from None
            edges.setdefault(n, []).append((job, False, dependency.condition))
    graph = {n: [on for on, within, _ in doc_edges if within] for n, doc_edges in edges.items()}
    cycle = holding.cycle_in(graph)
    if cycle is not None:
        def label(n: int) -> str:
            return f"document {n + 1}" + (f" ({specs[n].name})" if specs[n].name else "")
        raise InvalidRequest("submit: the dependencies form a cycle: " + " -> ".join(label(n) for n in cycle))
    return edges


@dataclass(frozen=True)
class Released:
    queued: int
    failed: int


def release(session: Session, now: datetime) -> Released:
    """One pass of the leader: decide the dependencies whose jobs have ended, then queue the waiting jobs
    with nothing left to wait for (fail those whose dependencies can no longer be met), then fill the free
    slots of arrays in index order."""
    targets = {t.job_id: t for t in holds.open_targets(session)}
    verdicts = [(t.job_id, condition, met) for t in targets.values() for condition in CONDITIONS
                if (met := holding.met(condition, t)) is not None]
    changed = holds.decide(session, verdicts)
    candidates = sorted(set(changed) | set(holds.due(session, now)))
    queue: list[int] = []
    failed: dict[int, str] = {}
    held: dict[int, tuple[str, str]] = {}
    for w in holds.waiting(session, candidates):
        if w.failed is not None:
            on, condition, state, is_array = w.failed
            failed[w.id] = holding.failed_reason(Target(on, state, True, is_array), condition)
            continue
        hold = w.hold
        if hold == holding.TIME and w.start_after is not None and w.start_after > now:
            continue
        if hold != holding.DEPENDENCIES or not w.unmet:
            hold = holding.next_hold(after=hold, start_after=w.start_after, now=now, unmet=bool(w.unmet),
                                     array_limited=w.parallelism is not None)
        if hold is None:
            queue.append(w.id)
        else:
            held[w.id] = (hold, holding.waiting_reason(hold, start_after=w.start_after, unmet=w.unmet,
                                                       array_id=w.array_id, parallelism=w.parallelism))
    holds.hold(session, held)
    emptied = []  # arrays whose last elements waiting for a slot get one now
    for array in holds.arrays_waiting(session):
        free = array.parallelism - array.live
        if free > 0:
            elements = holds.next_elements(session, array.id, free)
            queue += elements
            if len(elements) < free:
                emptied.append(array.id)
    queued = lifecycle.release(session, queue)
    ended = lifecycle.fail_waiting(session, failed)
    holds.settle_arrays(session, emptied)
    if queued or ended:
        log.info("waiting jobs released", extra={"queued": len(queued), "failed": len(ended)})
    return Released(len(queued), len(ended))

