"""The outbox: commands for agents, kept until each agent acks them (at-least-once delivery)."""
from __future__ import annotations

from sqlalchemy import insert, text
from sqlalchemy.orm import Session

from dispatcher.store.channels import OUTBOX_CHANNEL, notify
from dispatcher.store.database import driver, named
from dispatcher.store.models import OutboxCommand


def lock_clusters(session: Session, clusters) -> None:
    """Serialise outbox writes per cluster until this transaction ends.

    Command ids then commit in id order for each cluster, which the agent link relies on: it sends
    commands in id order and the agent's applied_through is a watermark over them. Locks are taken in
    name order so two writers never deadlock.
    """
    driver(session).execute("SELECT pg_advisory_xact_lock(7303, hashtext(c)) "
                            "FROM (SELECT c FROM unnest(%(cs)s::text[]) AS c ORDER BY c) ordered",
                            {"cs": sorted(set(clusters))})  # one round trip; volatile calls run in the sorted order


# The document an attempt runs: the job's, and for an array element, its array's id and its index in `spec`.
_DOCUMENT = """CASE WHEN j.array_id IS NULL THEN j.spec::text
                    ELSE jsonb_set(j.spec, '{spec}', (j.spec -> 'spec')
                                   || jsonb_build_object('arrayId', j.array_id, 'arrayIndex', j.array_index))::text
               END"""


def pending(session: Session, cluster: str, after_id: int = 0, limit: int = 500) -> list:
    """Unacked commands for a cluster in id order, after a cursor, each with its job's document (`spec`):
    a dispatch command does not copy it, every attempt of a job runs the same document. Rows: id, kind,
    job_id, attempt, reason (a cancel's), avoid_nodes (a dispatch's: the nodes its pods must not be bound to),
    spec_json (the document as JSON text, as the link sends it)."""
    return named(session,
                 f"""SELECT o.id, o.kind, o.job_id, o.attempt, coalesce(o.payload ->> 'reason', '') AS reason,
                           coalesce(o.payload -> 'avoidNodes', '[]'::jsonb) AS avoid_nodes,
                           {_DOCUMENT} AS spec_json
                    FROM outbox o JOIN jobs j ON j.id = o.job_id
                    WHERE o.cluster = %(cluster)s AND o.acked_at IS NULL AND o.id > %(after)s
                    ORDER BY o.id LIMIT %(limit)s""", {"cluster": cluster, "after": after_id, "limit": limit})


def pending_many(session: Session, wants: list[tuple[str, int]], limit: int = 500) -> list[list]:
    """pending() for many (cluster, after_id) at once, in one query: one list of rows per want, in order."""
    out: list[list] = [[] for _ in wants]
    for row in named(session,
                     f"""SELECT w.n, o.id, o.kind, o.job_id, o.attempt, coalesce(o.payload ->> 'reason', '') AS reason,
                           coalesce(o.payload -> 'avoidNodes', '[]'::jsonb) AS avoid_nodes,
                               {_DOCUMENT} AS spec_json
                        FROM unnest(%(clusters)s::text[], %(afters)s::bigint[]) WITH ORDINALITY AS w(cluster, after, n)
                        CROSS JOIN LATERAL (SELECT * FROM outbox o
                                            WHERE o.cluster = w.cluster AND o.acked_at IS NULL AND o.id > w.after
                                            ORDER BY o.id LIMIT %(limit)s) o
                        JOIN jobs j ON j.id = o.job_id
                        ORDER BY w.n, o.id""",
                     {"clusters": [c for c, _ in wants], "afters": [a for _, a in wants], "limit": limit}):
        out[row.n - 1].append(row)
    return out


def ack_many(session: Session, acks: list[tuple[str, int]]) -> None:
    """ack() for many (cluster, command id) at once, in one statement."""
    driver(session).execute("UPDATE outbox o SET acked_at = now() "
                            "FROM unnest(%(clusters)s::text[], %(ids)s::bigint[]) AS a(cluster, id) "
                            "WHERE o.id = a.id AND o.cluster = a.cluster AND o.acked_at IS NULL",
                            {"clusters": [c for c, _ in acks], "ids": [i for _, i in acks]})


def ack(session: Session, cluster: str, command_ids: list[int]) -> None:
    # Bound to the cluster: an agent can only ack its own commands.
    driver(session).execute("UPDATE outbox SET acked_at = now() "
                            "WHERE cluster = %(cluster)s AND id = ANY(%(ids)s) AND acked_at IS NULL",
                            {"cluster": cluster, "ids": list(command_ids)})


def acked_through(session: Session, clusters: list[str]) -> dict[str, int]:
    """The highest command id each of these clusters acked (0: none)."""
    acked = dict.fromkeys(clusters, 0)
    for row in named(session, "SELECT cluster, max(id) AS id FROM outbox WHERE cluster = ANY(%(clusters)s) "
                              "AND acked_at IS NOT NULL GROUP BY cluster", {"clusters": list(clusters)}):
        acked[row.cluster] = row.id
    return acked


def add_cancel(session: Session, cluster: str, job_id: int, attempt: int, reason: str) -> None:
    """A cancel command for the attempt. Its dispatch command, if no agent has acked it, is withdrawn: a
    link that has not sent it yet never will (no pods made after the cancel); one already on its way is
    undone by the cancel, which is always sent."""
    lock_clusters(session, [cluster])
    driver(session).execute("DELETE FROM outbox WHERE cluster = %(cluster)s AND acked_at IS NULL AND kind = 'dispatch' "
                            "AND job_id = %(job)s AND attempt = %(attempt)s",
                            {"cluster": cluster, "job": job_id, "attempt": attempt})
    session.execute(insert(OutboxCommand).values(cluster=cluster, kind="cancel", job_id=job_id, attempt=attempt,
                                                 payload={"reason": reason}))
    notify(session, OUTBOX_CHANNEL, cluster)


def unacked_dispatches(session: Session, clusters: list[str]) -> dict[str, set[tuple[int, int]]]:
    """(job, attempt) of the dispatch commands for each of these clusters that its agent has not acked yet."""
    unacked: dict[str, set[tuple[int, int]]] = {cluster: set() for cluster in clusters}
    for row in named(session, "SELECT cluster, job_id, attempt FROM outbox WHERE cluster = ANY(%(clusters)s) "
                              "AND kind = 'dispatch' AND acked_at IS NULL", {"clusters": list(clusters)}):
        unacked[row.cluster].add((row.job_id, row.attempt))
    return unacked


def unacked_per_cluster(session: Session) -> list:
    """(cluster, commands, oldest_age_s) for every cluster: its unacked commands and the age of the oldest
    by the database's clock (0 and 0.0 when it has none)."""
    return session.execute(text(
        """SELECT c.name AS cluster, count(o.id) AS commands,
                  coalesce(extract(epoch FROM now() - min(o.created_at)), 0) AS oldest_age_s
           FROM clusters c LEFT JOIN outbox o ON o.cluster = c.name AND o.acked_at IS NULL
           GROUP BY c.name ORDER BY c.name""")).all()


def prune(session: Session, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` commands per cluster that nothing reads any more; returns how many went.

    Such a command was acked, is at or below its cluster's applied_through (the capacity the agent last
    reported shows it: the cycle's in-flight sums read only the commands above), is not its cluster's
    newest acked command (acked_through, which a reconnecting agent's watermark starts from), and was
    made more than `older_than_s` ago. Oldest first, along ix_outbox_cluster_id."""
    return driver(session).execute(
        """DELETE FROM outbox WHERE id IN (
               SELECT o.id FROM clusters c
               CROSS JOIN LATERAL (SELECT max(id) AS id FROM outbox
                                   WHERE outbox.cluster = c.name AND acked_at IS NOT NULL) newest
               CROSS JOIN LATERAL (SELECT id FROM outbox
                                   WHERE outbox.cluster = c.name AND outbox.id <= c.applied_through
                                     AND outbox.id < newest.id AND acked_at IS NOT NULL
                                     AND created_at < now() - make_interval(secs => %(s)s)
                                   ORDER BY id LIMIT %(limit)s) o)""",
        {"s": older_than_s, "limit": limit}).rowcount
