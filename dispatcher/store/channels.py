"""Postgres NOTIFY channels: the one place that names them and sends on them (what WAKE_CHANNEL carries is
dispatcher/wakes.py's). A NOTIFY is queued in the caller's transaction and delivered only if it commits."""
from __future__ import annotations

from sqlalchemy.orm import Session

from dispatcher.store.database import driver

WAKE_CHANNEL = "sluice_wake"  # new work or freed room: the scheduler should run a cycle (payloads: dispatcher.wakes)
EVENTS_CHANNEL = "sluice_events"  # job events were written
OUTBOX_CHANNEL = "sluice_outbox"  # payload: cluster name with new commands
TOKENS_CHANNEL = "sluice_tokens"  # a token was revoked (payload: its id): cached verifications are dropped


def notify(session: Session, channel: str, payload: str = "") -> None:
    """Queue a NOTIFY; Postgres delivers it when (and only if) the transaction commits."""
    notify_many(session, [(channel, payload)])


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
