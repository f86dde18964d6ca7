"""Postgres NOTIFY channels and the wake-up payloads: the one place that names them and encodes
and decodes what they carry. A NOTIFY is queued in the caller's transaction and delivered only if it
commits."""
from __future__ import annotations

from sqlalchemy.orm import Session

from dispatcher.store.database import driver

WAKE_CHANNEL = "sluice_wake"  # new work or freed capacity: the scheduler should run a cycle
# Payloads of WAKE_CHANNEL: a queue's name (a queued job was cancelled, or went back to its queue), a
# submit's (submit_wake: the name, a space, its best new job's order), ROOM (room may have freed: a
# cluster's capacity changed or an attempt ended; no job became queued), or "" (anything may have
# changed). Queue names never start with "+" and hold no space.
ROOM = "+room"
EVENTS_CHANNEL = "sluice_events"  # job events were written
OUTBOX_CHANNEL = "sluice_outbox"  # payload: cluster name with new commands
TOKENS_CHANNEL = "sluice_tokens"  # a token was revoked (payload: its id): cached verifications are dropped


def notify(session: Session, channel: str, payload: str = "") -> None:
    """Queue a NOTIFY; Postgres delivers it when (and only if) the transaction commits."""
    notify_many(session, [(channel, payload)])


def submit_wake(queue: str, class_priority: int, priority: int, job_id: int) -> str:
    """The wake-up of a submit to `queue`: its name, then the place of its best new job in the queue's
    order (class priority and priority, higher first, then id), which scheduler.parking.Parking
    compares with the heads it parked."""
    return f"{queue} {class_priority} {priority} {job_id}"


def notify_many(session: Session, notes: list[tuple[str, str]]) -> None:
    """Queue several NOTIFYs, (channel, payload) each, in one round trip; delivered as notify's are."""
    if notes:
        driver(session).execute(NOTIFY_SQL, notes_params(notes))


# NOTIFY each (channel, payload) of the arrays %(c)s and %(p)s (psycopg's parameters: see
# database.driver); also a part of a statement that writes first, to save a round trip.
NOTIFY_SQL = "SELECT pg_notify(n.c, n.p) FROM unnest(%(c)s::text[], %(p)s::text[]) AS n(c, p)"


def notes_params(notes: list[tuple[str, str]]) -> dict:
    """NOTIFY_SQL's parameters for these (channel, payload) pairs."""
    return {"c": [c for c, _ in notes], "p": [p for _, p in notes]}


def parse_wake(payload: str) -> tuple[str, tuple[int, int, int] | None]:
    """A WAKE_CHANNEL payload read back: (the queue it names, "" for none; the order key of a submit's best
    new job, or None). ROOM names no queue."""
    if payload == ROOM:
        return "", None
    queue, _, order = payload.partition(" ")
    return queue, (order_key_of(order) if order else None)


def order_key(class_priority: int, priority: int, job_id: int) -> tuple[int, int, int]:
    """A queued job's place in its queue's order, comparable with < (earlier first): class priority and
    priority descending, then id (the order cycle_reads.queue_heads reads in)."""
    return -class_priority, -priority, job_id


def order_key_of(text: str) -> tuple[int, int, int] | None:
    """order_key from a wake-up's "class_priority priority id"; None for anything else."""
    try:
        return order_key(*map(int, text.split()))
    except (TypeError, ValueError):
        return None
