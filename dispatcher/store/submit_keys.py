"""Submit idempotency keys: per user, the ids a keyed submit committed and a digest of its documents.

A key row is written in the same statement or transaction as the jobs it names (store.lifecycle.submit),
so a submit and its key commit together or not at all. A second submit with a key its user has used
fails on the primary key (`KeyUsed`), waiting, as Postgres does, for a concurrent one to commit or roll
back; its caller then answers the ids `find` reads. Rows older than the scheduler's retention (a day by
default: dispatcher/scheduler/settings.py) are pruned between cycles, found by a BRIN index on created_at
(rows arrive in time order; it costs an insert next to nothing).
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg

from dispatcher.errors import Conflict
from dispatcher.store.copy_codec import dumps
from dispatcher.store.database import Session, driver

CONSTRAINT = "submit_keys_pkey"


@dataclass(frozen=True)
class NewKey:
    """The key of one submit in a write: its jobs are the `count` rows after the write's first `after`."""

    subject: str
    key: str
    digest: str
    after: int
    count: int


class KeyUsed(Conflict):
    """A submit named a key its user's earlier submit committed with (or one committing now)."""


def is_key_conflict(exc: psycopg.errors.UniqueViolation) -> bool:
    return exc.diag.constraint_name == CONSTRAINT


def params(keys: list[NewKey]) -> str:
    """The keys of a write as the JSON array the insert statements take (jsonb_to_recordset)."""
    if not keys:
        return "[]"
    return dumps([{"subject": k.subject, "key": k.key, "digest": k.digest, "after": k.after, "count": k.count}
                  for k in keys]).decode()


# Rows of %(keys)s, each with the ids of its jobs taken from `new` (the insert's CTE of ids in write order, n).
FROM_NEW = """INSERT INTO submit_keys (subject, key, digest, ids)
               SELECT k.subject, k.key, k.digest,
                      ARRAY(SELECT id FROM new WHERE new.n > k.after AND new.n <= k.after + k.count ORDER BY new.n)
               FROM jsonb_to_recordset(CAST(%(keys)s AS jsonb))
                    AS k(subject text, key text, digest text, after int, count int)
               WHERE EXISTS (SELECT FROM new)"""


def record(connection: psycopg.Connection, keys: list[NewKey], ids: list[int]) -> None:
    """Write the keys of a write whose jobs took `ids`, in order (the COPY path, where ids come first)."""
    if not keys:
        return
    connection.execute(
        """INSERT INTO submit_keys (subject, key, digest, ids)
           SELECT k.subject, k.key, k.digest, ARRAY(SELECT jsonb_array_elements_text(k.ids)::bigint)
           FROM jsonb_to_recordset(CAST(%(keys)s AS jsonb)) AS k(subject text, key text, digest text, ids jsonb)""",
        {"keys": dumps([{"subject": k.subject, "key": k.key, "digest": k.digest,
                         "ids": ids[k.after:k.after + k.count]} for k in keys]).decode()})


def find(session: Session, subject: str, key: str) -> tuple[str, list[int]] | None:
    """(digest, ids) of the submit `subject` committed with `key`, or None."""
    row = driver(session).execute("SELECT digest, ids FROM submit_keys WHERE subject = %s AND key = %s",
                                  (subject, key)).fetchone()
    return None if row is None else (row[0], list(row[1]))


def prune(session: Session, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` keys made more than `older_than_s` ago, oldest first; returns how many went."""
    return driver(session).execute(
        """DELETE FROM submit_keys WHERE (subject, key) IN (
               SELECT subject, key FROM submit_keys
               WHERE created_at < now() - make_interval(secs => %(s)s) ORDER BY created_at LIMIT %(limit)s)""",
        {"s": older_than_s, "limit": limit}).rowcount
