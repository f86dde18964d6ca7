"""Clusters, queues and service classes: the admin objects, and the capacity agents report."""
from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from dispatcher.errors import NotFound
from dispatcher.policy import states
from dispatcher.store.database import driver, named
from dispatcher.store.models import BurstPolicy, Cluster, Job, Queue, ServiceClass
from sluice.objects import BurstPolicyObject, ClusterObject, QueueObject, ServiceClassObject


def apply_object(session: Session, obj) -> None:
    """Create or update one admin object from its parsed form (sluice.objects)."""
    doc = obj.to_document()
    if isinstance(obj, ClusterObject):
        values = dict(name=obj.name, tier=obj.tier, site=obj.site, labels=dict(obj.labels), spec=doc)
        table = Cluster
    elif isinstance(obj, QueueObject):
        values = dict(name=obj.name, parent=obj.parent, spec=doc)
        table = Queue
    elif isinstance(obj, ServiceClassObject):
        values = dict(name=obj.name, priority=obj.priority, spec=doc)
        table = ServiceClass
    elif isinstance(obj, BurstPolicyObject):
        values = dict(name=obj.name, spec=doc)
        table = BurstPolicy
    else:
        raise TypeError(f"{type(obj).__name__} objects are not stored yet")
    stmt = insert(table).values(**values)
    session.execute(stmt.on_conflict_do_update(index_elements=["name"],
                                               set_={k: v for k, v in values.items() if k != "name"}))


def apply_objects(session: Session, objects) -> None:
    # Parents before children, classes before the queues that name them.
    order = {ServiceClassObject: 0, ClusterObject: 1, QueueObject: 2, BurstPolicyObject: 3}
    pending = sorted((o for o in objects if type(o) in order), key=lambda o: order[type(o)])
    queues = {o.name for o in pending if isinstance(o, QueueObject)}
    done: set[str] = set(session.scalars(select(Queue.name)))
    for obj in [o for o in pending if not isinstance(o, QueueObject)]:
        apply_object(session, obj)
    remaining = [o for o in pending if isinstance(o, QueueObject)]
    while remaining:
        ready = [q for q in remaining if not q.parent or q.parent in done or q.parent not in queues]
        if not ready:
            ready = remaining  # a cycle: let the foreign key report it
        for q in ready:
            apply_object(session, q)
            done.add(q.name)
        remaining = [q for q in remaining if q not in ready]


def _get(session: Session, model, what: str, name: str):
    row = session.get(model, name)
    if row is None:
        raise NotFound(f"{what} {name!r} not found")
    return row


def get_cluster(session: Session, name: str) -> Cluster:
    return _get(session, Cluster, "cluster", name)


def list_clusters(session: Session) -> list[Cluster]:
    return list(session.scalars(select(Cluster).order_by(Cluster.name)))


# Every cluster's row, by name, as a named tuple (database.at_once) with Cluster's attributes: what each
# scheduling cycle reads (and changes nothing of), without making an ORM object of each. The Cluster object's
# document and the two capacity documents come as their JSON text: most are the same as a cycle ago (a
# heartbeat that changed nothing), and capacity.snapshot parses each distinct text once, not every cycle.
AS_TEXT = ("spec", "capacity", "prometheus_capacity")
CLUSTER_ROWS = "SELECT {} FROM clusters ORDER BY name".format(
    ", ".join(f"{c.name}::text AS {c.name}" if c.name in AS_TEXT else c.name for c in Cluster.__table__.columns))


def hello_rows(session: Session, names: list[str]) -> dict[str, tuple[dict, bool]]:
    """For each of these clusters that exists: its Cluster object's document, and whether it never reported
    capacity."""
    return {row.name: (row.spec or {}, row.first) for row in named(
        session, "SELECT name, spec, capacity IS NULL AS first FROM clusters WHERE name = ANY(%(names)s)",
        {"names": list(names)})}


def record_capacity(session: Session, name: str, capacity: dict, applied_through: int, now: datetime, *,
                    first: bool = False) -> None:
    """Store an agent's capacity report. Within a connection the watermark only rises; the first
    report of a new connection (a new agent process) sets it afresh."""
    driver(session).execute(
        f"""UPDATE clusters SET capacity = %(capacity)s::jsonb, capacity_at = %(now)s, last_seen_at = %(now)s,
                   applied_through = {"%(applied)s" if first else "greatest(applied_through, %(applied)s)"}
            WHERE name = %(name)s""",
        {"capacity": json.dumps(capacity), "now": now, "applied": applied_through, "name": name})


def record_heartbeats(session: Session, beats: list[tuple[str, dict, int]], now: datetime, *,
                      first: bool = False) -> None:
    """record_capacity() of many clusters' heartbeats (name, capacity, applied_through) in one statement; the
    rows are locked in name order (two writers of several never deadlock). first: each a hello's."""
    beats = sorted(beats, key=lambda beat: beat[0])
    driver(session).execute(
        f"""UPDATE clusters c SET capacity = b.capacity::jsonb, capacity_at = %(now)s, last_seen_at = %(now)s,
                  applied_through = {"b.applied" if first else "greatest(c.applied_through, b.applied)"}
           FROM unnest(%(names)s::text[], %(capacities)s::text[], %(applied)s::bigint[]) AS b(name, capacity, applied)
           WHERE c.name = b.name""",
        {"names": [b[0] for b in beats], "capacities": [json.dumps(b[1]) for b in beats],
         "applied": [b[2] for b in beats], "now": now})


def record_prometheus(session: Session, name: str, capacity: dict, sampled_at: datetime) -> None:
    session.execute(update(Cluster).where(Cluster.name == name).values(
        prometheus_capacity=capacity, prometheus_at=sampled_at))


def get_queue(session: Session, name: str) -> Queue:
    return _get(session, Queue, "queue", name)


def list_queues(session: Session) -> list[Queue]:
    return list(session.scalars(select(Queue).order_by(Queue.name)))


def service_classes(session: Session) -> dict[str, ServiceClass]:
    return {c.name: c for c in session.scalars(select(ServiceClass))}


def queue_usage(session: Session) -> dict[str, tuple[int, int, list[dict]]]:
    """Per queue: (queued jobs, active jobs, requests of the active ones)."""
    out: dict[str, tuple[int, int, list[dict]]] = {}
    for queue, state, n in session.execute(
            select(Job.queue, Job.state, func.count()).where(Job.state.in_((states.QUEUED, *states.ACTIVE)))
            .group_by(Job.queue, Job.state)):
        q, a, r = out.get(queue, (0, 0, []))
        out[queue] = (q + n, a, r) if state == states.QUEUED else (q, a + n, r)
    for queue, requests in session.execute(
            select(Job.queue, Job.requests).where(Job.state.in_(states.ACTIVE))):
        q, a, r = out.get(queue, (0, 0, []))
        r.append(requests)
        out[queue] = (q, a, r)
    return out


def running_per_cluster(session: Session) -> dict[str, int]:
    return dict(session.execute(select(Job.cluster, func.count()).where(
        Job.state.in_(states.ACTIVE)).group_by(Job.cluster)).all())


def set_state(session: Session, name: str, state: str) -> str:
    """Set a cluster's state (active | cordoned | draining); returns the state it had."""
    previous = session.scalar(select(Cluster.state).where(Cluster.name == name).with_for_update())
    if previous is None:
        raise NotFound(f"cluster {name!r} not found")
    session.execute(update(Cluster).where(Cluster.name == name).values(state=state))
    return previous


def burst_policies(session: Session) -> list[BurstPolicy]:
    return list(session.scalars(select(BurstPolicy).order_by(BurstPolicy.name)))


# What validating a submit reads, in one round trip: the classes, the queues named, the version of all of it
# (submit_config, kept by triggers: migration 0008) and every cluster, only when the version is not `seen`.
_SUBMIT_CLASSES = "(SELECT coalesce(jsonb_object_agg(name, priority), '{}') FROM service_classes)"
_SUBMIT_QUEUES = "(SELECT coalesce(jsonb_object_agg(name, spec), '{}') FROM queues WHERE name = ANY(:queues))"
_SUBMIT_CLUSTERS = """(SELECT coalesce(jsonb_agg(jsonb_build_array(
                   name, tier, site, labels, spec,
                   CASE WHEN capacity IS NULL OR capacity = '{}' THEN NULL
                        ELSE coalesce(capacity -> 'allocatable', '{}') END) ORDER BY name), '[]')
               FROM clusters)"""
_SUBMIT_CONFIG = text(f"""SELECT {_SUBMIT_CLASSES}, {_SUBMIT_QUEUES}, v.version,
                                 CASE WHEN v.version = :seen THEN NULL ELSE {_SUBMIT_CLUSTERS} END
                          FROM submit_config v WHERE v.id = 1""")


def submit_config(session: Session, queues: set[str], seen: int | None) -> tuple[dict, dict, int, list | None]:
    """(classes {name: priority}, queues named {name: document}, version, clusters): clusters is None when the
    version is still `seen`, else [name, tier, site, labels, document, allocatable or None] per cluster."""
    return tuple(session.execute(_SUBMIT_CONFIG, {"queues": list(queues), "seen": seen}).one())
