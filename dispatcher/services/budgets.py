"""Burst policies and what they have spent, read from Postgres for the scheduler (budgets) and for
`sluice usage` (burst spend against budgets). The arithmetic is in policy/bursting.py and accounting.py.

Budgets run per UTC day. A burst attempt's record (attempts.burst) carries its policy, queue, hourly
rate, expected cost and requests, as decided; prices changed later do not change what it cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispatcher.policy import accounting, bursting, states
from dispatcher.policy.bursting import Budget, BurstRule, Spend
from dispatcher.services.admin_objects import rule_of
from dispatcher.store import clusters as cluster_store
from dispatcher.store import usage as usage_totals
from dispatcher.store.database import Session
from sluice.objects import object_from_document


def rules(session: Session) -> list[BurstRule]:
    return [rule_of(object_from_document(row.spec)) for row in cluster_store.burst_policies(session)]


def day_start(now: datetime) -> datetime:
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def _run(row, now: datetime) -> bursting.BurstRun:
    b = row.burst
    return bursting.BurstRun(b["policy"], b["queue"], b["ratePerHour"], b["expectedCost"], b.get("requests", {}),
                             row.state in states.ACTIVE, row.dispatched_at.timestamp(),
                             row.started_at.timestamp() if row.started_at else None,
                             row.finished_at.timestamp() if row.finished_at else None)


def spend(session: Session, now: datetime) -> dict[tuple[str, str | None], Spend]:
    """What every burst policy, and every queue under it, has committed (see bursting.committed)."""
    day = day_start(now)
    runs = [_run(row, now) for row in usage_totals.burst_attempts(session, day)]
    return bursting.committed(runs, day.timestamp(), now.timestamp())


@dataclass(frozen=True)
class BudgetRow:
    policy: str
    queue: str  # "": the policy as a whole
    spent_in_window: float
    attempts: int
    committed: Spend  # today's spend, the running rate and resources
    budget: Budget


def report(session: Session, now: datetime, win: accounting.Window) -> list[BudgetRow]:
    """Per policy, then per queue that burst under it: spend in the window and today, against budgets."""
    day = day_start(now)
    since = day if win.start is None else min(day, win.start)
    rows = usage_totals.burst_attempts(session, None if win.start is None else since)
    runs = [_run(row, now) for row in rows]
    today = bursting.committed([r for r in runs if r.finished_at is None or r.finished_at >= day.timestamp()],
                               day.timestamp(), now.timestamp())
    in_window: dict[tuple[str, str | None], tuple[float, int]] = {}
    for run, row in zip(runs, rows):
        seconds = accounting.seconds_in_window(accounting.AttemptRun(
            run.queue, "", "", "", run.requests, row.started_at, row.finished_at), win)
        if seconds <= 0:
            continue
        for key in ((run.policy, None), (run.policy, run.queue)):
            spent, count = in_window.get(key, (0.0, 0))
            in_window[key] = (spent + run.rate * seconds / 3600.0, count + 1)
    out = []
    for rule in rules(session):
        queues = sorted({q for (p, q) in (*today, *in_window) if p == rule.name and q is not None})
        for queue in (None, *queues):
            spent, count = in_window.get((rule.name, queue), (0.0, 0))
            out.append(BudgetRow(rule.name, queue or "", spent, count, today.get((rule.name, queue), Spend()),
                                 rule.budget if queue is None else rule.queue_budget))
    return out
