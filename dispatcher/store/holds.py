"""What waiting jobs wait for, in the store: their dependencies, holds and arrays (policy/holding.py says
what to do with them; lifecycle moves them out of WAITING). Reads go by the partial indexes of migration
0012, so a pass costs what changed, not what waits: the open dependencies' targets, the jobs whose time
came, and a few elements of each array with free slots."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispatcher.policy import states
from dispatcher.policy.holding import ARRAY, TIME, Target, array_target
from dispatcher.store.database import Session, driver, named
from dispatcher.store.models import sql_strings

_LIVE = sql_strings({states.QUEUED, *states.ACTIVE})  # an array element that holds one of its slots


def open_targets(session: Session) -> list[Target]:
    """The jobs (or arrays) some dependency not yet decided waits on, each with what it has done."""
    rows = named(session, """SELECT t.id, j.state, a.id IS NOT NULL AS is_array
                             FROM (SELECT DISTINCT depends_on AS id FROM job_dependencies WHERE met IS NULL) t
                             JOIN jobs j ON j.id = t.id LEFT JOIN job_arrays a ON a.id = t.id""")
    arrays = [r.id for r in rows if r.is_array]
    counts: dict[int, dict[str, int]] = {a: {} for a in arrays}
    if arrays:
        for array_id, state, n in driver(session).execute(
                "SELECT array_id, state, count(*) FROM jobs WHERE array_id = ANY(%(ids)s) GROUP BY 1, 2",
                {"ids": arrays}):
            counts[array_id][state] = n
    return [array_target(r.id, counts[r.id]) if r.is_array
            else Target(r.id, r.state, r.state in states.FINAL and r.state != states.SUCCEEDED) for r in rows]


def decide(session: Session, verdicts: list[tuple[int, str, bool]]) -> list[int]:
    """Record, for each (target, condition, met), whether the dependencies on that target with that
    condition are met; the jobs that depend on them, those whose holds may now be over."""
    if not verdicts:
        return []
    return sorted({row[0] for row in driver(session).execute(
        """UPDATE job_dependencies d SET met = v.met
           FROM unnest(%(on)s::bigint[], %(conditions)s::text[], %(met)s::bool[]) AS v(on_id, condition, met)
           WHERE d.depends_on = v.on_id AND d.condition = v.condition AND d.met IS NULL
           RETURNING d.job_id""",
        {"on": [t for t, _, _ in verdicts], "conditions": [c for _, c, _ in verdicts],
         "met": [m for _, _, m in verdicts]})})


def due(session: Session, now: datetime, limit: int = 10_000) -> list[int]:
    """Waiting jobs whose startAfter has come."""
    return [row[0] for row in driver(session).execute(
        f"""SELECT id FROM jobs WHERE state = '{states.WAITING}' AND hold = '{TIME}' AND start_after <= %(now)s
            ORDER BY id LIMIT %(limit)s""", {"now": now, "limit": limit})]


@dataclass(frozen=True)
class Waiting:
    """What one waiting job waits for, as the release pass reads it."""

    id: int
    hold: str
    start_after: datetime | None
    array_id: int | None
    parallelism: int | None  # its array's, when it has one
    unmet: tuple[tuple[int, str], ...]  # (job id, condition) of its dependencies not yet decided
    failed: tuple[int, str, str, bool] | None  # (job id, condition, state, is an array) of one that cannot be met


def waiting(session: Session, ids: list[int]) -> list[Waiting]:
    """These jobs, those still WAITING, with their dependencies not yet met."""
    if not ids:
        return []
    rows = named(session,
                 f"""SELECT j.id, j.hold, j.start_after, j.array_id, a.parallelism,
                            coalesce(array_agg(ARRAY[d.depends_on::text, d.condition])
                                     FILTER (WHERE d.job_id IS NOT NULL AND d.met IS NULL), '{{}}') AS unmet,
                            (array_agg(ARRAY[d.depends_on::text, d.condition, t.state, (ta.id IS NOT NULL)::text]
                                       ORDER BY d.depends_on) FILTER (WHERE d.met = false))[1:1] AS failed
                     FROM jobs j LEFT JOIN job_arrays a ON a.id = j.array_id
                     LEFT JOIN job_dependencies d ON d.job_id = j.id
                     LEFT JOIN jobs t ON t.id = d.depends_on AND d.met = false
                     LEFT JOIN job_arrays ta ON ta.id = t.id
                     WHERE j.id = ANY(%(ids)s) AND j.state = '{states.WAITING}'
                     GROUP BY j.id, a.parallelism ORDER BY j.id""", {"ids": ids})
    return [Waiting(r.id, r.hold, r.start_after, r.array_id, r.parallelism,
                    tuple((int(on), condition) for on, condition in r.unmet),
                    (int(r.failed[0][0]), r.failed[0][1], r.failed[0][2], r.failed[0][3] == "true") if r.failed
                    else None)
            for r in rows]


def hold(session: Session, holds: dict[int, tuple[str, str]]) -> None:
    """Set what these waiting jobs wait for now, with the reason each shows: {id: (hold, reason)}."""
    if not holds:
        return
    ids = sorted(holds)
    driver(session).execute(
        f"""UPDATE jobs SET hold = h.hold, reason = h.reason
            FROM unnest(%(ids)s::bigint[], %(holds)s::text[], %(reasons)s::text[]) AS h(id, hold, reason)
            WHERE jobs.id = h.id AND jobs.state = '{states.WAITING}'
              AND (jobs.hold, jobs.reason) IS DISTINCT FROM (h.hold, h.reason)""",
        {"ids": ids, "holds": [holds[i][0] for i in ids], "reasons": [holds[i][1] for i in ids]})
    arrays = [i for i in ids if holds[i][0] == ARRAY]
    if arrays:
        driver(session).execute("""UPDATE job_arrays SET waiting = true WHERE NOT waiting AND id IN (
                                       SELECT array_id FROM jobs WHERE id = ANY(%(ids)s))""", {"ids": arrays})


@dataclass(frozen=True)
class ArraySlots:
    id: int
    parallelism: int
    live: int  # elements queued, dispatched or running


def arrays_waiting(session: Session) -> list[ArraySlots]:
    """The arrays with elements waiting for a slot, and how many of their slots are taken."""
    return [ArraySlots(*row) for row in driver(session).execute(
        f"""SELECT a.id, a.parallelism,
                   (SELECT count(*) FROM jobs WHERE array_id = a.id AND state IN {_LIVE}) AS live
            FROM job_arrays a WHERE a.waiting ORDER BY a.id""")]


def next_elements(session: Session, array_id: int, n: int) -> list[int]:
    """The first `n` elements of an array waiting for a slot, in index order."""
    return [row[0] for row in driver(session).execute(
        f"""SELECT id FROM jobs WHERE array_id = %(a)s AND state = '{states.WAITING}' AND hold = '{ARRAY}'
            ORDER BY array_index LIMIT %(n)s""", {"a": array_id, "n": n})]


def settle_arrays(session: Session, array_ids: list[int]) -> None:
    """These arrays have no element waiting for a slot any more (unless one has)."""
    if array_ids:
        driver(session).execute(
            f"""UPDATE job_arrays a SET waiting = false WHERE a.id = ANY(%(ids)s) AND NOT EXISTS (
                    SELECT 1 FROM jobs WHERE array_id = a.id AND state = '{states.WAITING}' AND hold = '{ARRAY}')""",
            {"ids": array_ids})


def dependants(session: Session, job_id: int) -> list[tuple]:
    """The jobs that depend on this one: (job id, name, condition, met, state), in id order."""
    return [tuple(row) for row in driver(session).execute(
        """SELECT d.job_id, j.name, d.condition, d.met, j.state FROM job_dependencies d
           JOIN jobs j ON j.id = d.job_id WHERE d.depends_on = %(id)s ORDER BY d.job_id LIMIT 1000""",
        {"id": job_id})]


def dependencies(session: Session, job_id: int) -> list[tuple]:
    """What this job depends on: (job id, name, condition, met, state), in id order."""
    return [tuple(row) for row in driver(session).execute(
        """SELECT d.depends_on, j.name, d.condition, d.met, j.state FROM job_dependencies d
           JOIN jobs j ON j.id = d.depends_on WHERE d.job_id = %(id)s ORDER BY d.depends_on""",
        {"id": job_id})]
