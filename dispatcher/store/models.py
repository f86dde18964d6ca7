"""The schema: every table Sluice keeps in Postgres, the one source of truth.

Only migrations/ changes the real schema; tests/integration/test_migrations.py checks these models
match the migrations. Resource amounts are JSON maps of resource name to milli-units (sluice.quantity).
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, Identity, Index, Integer, Text, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# job_events, attempts and outbox name their job (job_id) with no foreign key (migration 0007). A key
# would check every row written, with a locking read of the job, on every submit, dispatch and report,
# and could never fail: jobs are never deleted, and each of those rows is written by a statement that
# read or wrote its job's row in the same transaction.


class Base(DeclarativeBase):
    type_annotation_map = {dict: JSONB, datetime: DateTime(timezone=True)}


def _now():
    return mapped_column(DateTime(timezone=True), server_default=text("now()"), nullable=False)


class Cluster(Base):
    __tablename__ = "clusters"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    tier: Mapped[str] = mapped_column(Text)
    site: Mapped[str] = mapped_column(Text, server_default="")
    labels: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))
    spec: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))  # the Cluster object's document
    state: Mapped[str] = mapped_column(Text, server_default="active")  # active | cordoned | draining
    # The agent's latest capacity report ({allocatable, free, largestFreeNode}) and when it came.
    capacity: Mapped[dict | None] = mapped_column(JSONB, nullable=True)
    capacity_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Dispatch commands with an id above this were not yet applied when the report was taken.
    applied_through: Mapped[int] = mapped_column(BigInteger, server_default="0")
    last_seen_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # The latest capacity read from Prometheus ({allocatable, free, largestFreeNode, attempts}: attempts are
    # the [job, attempt] pairs whose pods it saw), and the time of the samples it was computed from.
    prometheus_capacity: Mapped[dict | None] = mapped_column(JSONB, nullable=True)
    prometheus_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = _now()


class Queue(Base):
    __tablename__ = "queues"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    parent: Mapped[str | None] = mapped_column(Text, ForeignKey("queues.name"), nullable=True)
    spec: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))  # the Queue object's document
    created_at: Mapped[datetime] = _now()


class ServiceClass(Base):
    __tablename__ = "service_classes"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    spec: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()


class SubmitConfig(Base):
    """One row (id 1). Its version changes, at the commit, with every change to what Submit validates
    against: the triggers of migration 0008 on service_classes, queues and clusters."""
    __tablename__ = "submit_config"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger, server_default="0")


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    name: Mapped[str | None] = mapped_column(Text, nullable=True)
    queue: Mapped[str] = mapped_column(Text, ForeignKey("queues.name"))
    service_class: Mapped[str] = mapped_column(Text, ForeignKey("service_classes.name"))
    class_priority: Mapped[int] = mapped_column(Integer)  # copied at submit: the queue index orders by it
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    state: Mapped[str] = mapped_column(Text, server_default="QUEUED")
    reason: Mapped[str] = mapped_column(Text, server_default="")
    cluster: Mapped[str | None] = mapped_column(Text, ForeignKey("clusters.name"), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, server_default="0")  # 0 until first dispatched
    max_retries: Mapped[int] = mapped_column(Integer, server_default="2")
    spec: Mapped[dict] = mapped_column()  # canonical job document
    requests: Mapped[dict] = mapped_column()  # whole-job total, milli-units
    largest_pod: Mapped[dict] = mapped_column()  # per resource, the largest single pod's request
    # [[count, per-pod requests], ...] per pod set, for placement's packing; NULL for one pod (0009)
    pods: Mapped[list | None] = mapped_column(JSONB(none_as_null=True), nullable=True)
    placement: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))
    labels: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))
    submitted_by: Mapped[str] = mapped_column(Text, server_default="")
    preempted_by: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # evicted its last attempt
    # What a WAITING job waits for now: time | dependencies | array (policy/holding.py), NULL otherwise (0012).
    hold: Mapped[str | None] = mapped_column(Text, nullable=True)
    start_after: Mapped[datetime | None] = mapped_column(nullable=True)
    array_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # its array's element 0's job id
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attached_at: Mapped[datetime | None] = mapped_column(nullable=True)  # an interactive session's last attach
    created_at: Mapped[datetime] = _now()
    dispatched_at: Mapped[datetime | None] = mapped_column(nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)

    __table_args__ = (
        # The head of each queue, in its order: the scheduler reads a few jobs per queue. The only index in
        # that order: with a global one beside it, the planner could read a queue's heads through that (0016).
        Index("ix_jobs_queue_head", "queue", class_priority.desc(), priority.desc(), "id",
              postgresql_where=text("state = 'QUEUED'")),
        Index("ix_jobs_active_cluster", "cluster", postgresql_where=text("state IN ('DISPATCHED', 'RUNNING')")),
        # What runs, per queue and request: the cycle sums queue usage from this index alone (0006).
        Index("ix_jobs_active_usage", "queue", "requests", postgresql_where=text("state IN ('DISPATCHED', 'RUNNING')")),
        Index("ix_jobs_queue_state", "queue", "state"),
        Index("ix_jobs_state_id", "state", "id"),
        # The waiting jobs whose hold may be over, by hold and time; an array's elements in index order.
        Index("ix_jobs_waiting", "hold", "start_after", "id", postgresql_where=text("state = 'WAITING'")),
        Index("ix_jobs_array", "array_id", "state", "array_index", postgresql_where=text("array_id IS NOT NULL")),
    )


class JobArray(Base):
    """One document submitted as many jobs (its elements); its id is element 0's job id."""

    __tablename__ = "job_arrays"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    count: Mapped[int] = mapped_column(Integer)
    parallelism: Mapped[int | None] = mapped_column(Integer, nullable=True)  # queued or running at once
    first_index: Mapped[int] = mapped_column(Integer, server_default="0")
    waiting: Mapped[bool] = mapped_column(server_default="false")  # has elements held for a slot
    created_at: Mapped[datetime] = _now()

    __table_args__ = (Index("ix_job_arrays_waiting", "id", postgresql_where=text("waiting")),)


class JobDependency(Base):
    """Job `job_id` starts only once job (or array) `depends_on` met `condition`; `met` is NULL until known."""

    __tablename__ = "job_dependencies"
    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    depends_on: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    condition: Mapped[str] = mapped_column(Text)  # succeeded | failed | finished
    met: Mapped[bool | None] = mapped_column(nullable=True)

    __table_args__ = (
        Index("ix_job_dependencies_open", "depends_on", postgresql_where=text("met IS NULL")),
        Index("ix_job_dependencies_on", "depends_on"),  # the graph around a job, for describe
    )


class JobEvent(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger)  # no foreign key (see the top)
    attempt: Mapped[int] = mapped_column(Integer)
    from_state: Mapped[str] = mapped_column(Text, server_default="")
    to_state: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text, server_default="")
    cluster: Mapped[str | None] = mapped_column(Text, nullable=True)
    at: Mapped[datetime] = _now()

    __table_args__ = (Index("ix_job_events_job", "job_id", "id"),)


class Attempt(Base):
    """One run of a job in one cluster: the unit of exactly-once and of accounting."""

    __tablename__ = "attempts"
    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # no foreign key (see the top)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(Text, ForeignKey("clusters.name"))
    state: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text, server_default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    dispatched_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # The burst decision that sent it to a paid cluster (policy, trigger, alternatives, cost); None otherwise.
    burst: Mapped[dict | None] = mapped_column(JSONB(none_as_null=True), nullable=True)
    # How to reach its first pod (`10.1.2.3:8888`), as its agent last said while it ran; None: never said.
    address: Mapped[str | None] = mapped_column(Text, nullable=True)
    # What its pods hold on each node they are bound to ({node: {resource: milli}}), as its agent last said
    # while it ran; None: never said. Preemption then knows which room evicting it frees where.
    nodes: Mapped[dict | None] = mapped_column(JSONB(none_as_null=True), nullable=True)

    __table_args__ = (Index("ix_attempts_burst_finished", "finished_at", postgresql_where=text("burst IS NOT NULL")),)


class OutboxCommand(Base):
    """A command for one cluster's agent; it stays here, unacked, until the agent confirms it."""

    __tablename__ = "outbox"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    cluster: Mapped[str] = mapped_column(Text, ForeignKey("clusters.name"))
    kind: Mapped[str] = mapped_column(Text)  # dispatch | cancel
    job_id: Mapped[int] = mapped_column(BigInteger)  # no foreign key (see the top)
    attempt: Mapped[int] = mapped_column(Integer)
    payload: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()
    acked_at: Mapped[datetime | None] = mapped_column(nullable=True)

    __table_args__ = (
        Index("ix_outbox_unacked", "cluster", "id", postgresql_where=text("acked_at IS NULL")),
        Index("ix_outbox_cluster_id", "cluster", "id"),
    )


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    token_hash: Mapped[str] = mapped_column(Text, unique=True)  # sha256 of the secret; the secret is never stored
    role: Mapped[str] = mapped_column(Text)  # admin | user | agent
    subject: Mapped[str] = mapped_column(Text)
    cluster: Mapped[str | None] = mapped_column(Text, ForeignKey("clusters.name"), nullable=True)  # agent tokens
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class RevokedCertificate(Base):
    """An agent's client certificate that no longer authenticates it, by serial number (unique among the
    certificates of the one client CA the agent port trusts)."""

    __tablename__ = "revoked_certificates"
    serial: Mapped[str] = mapped_column(Text, primary_key=True)  # lowercase hex, no separators
    cluster: Mapped[str | None] = mapped_column(Text, nullable=True)  # as the certificate named it, when known
    not_after: Mapped[datetime | None] = mapped_column(nullable=True)  # the certificate's own end, when known
    revoked_at: Mapped[datetime] = _now()


class SubmitKey(Base):
    """A submit's idempotency key, per user: the ids it committed and a digest of its documents (a retry
    with the same key is answered with these ids); pruned once older than the scheduler's retention."""

    __tablename__ = "submit_keys"
    subject: Mapped[str] = mapped_column(Text, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    digest: Mapped[str] = mapped_column(Text)  # sha256 of the documents, as sent
    ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    created_at: Mapped[datetime] = _now()

    __table_args__ = (Index("ix_submit_keys_created_at", "created_at", postgresql_using="brin"),)


class IntakeJob(Base):
    """A Kubernetes Job submitted through a cluster's API server (the kubectl front door): the cluster and
    the Job's uid name it once and for ever, so that no re-list, agent or dispatcher restart submits it twice."""

    __tablename__ = "intake_jobs"
    cluster: Mapped[str] = mapped_column(Text, primary_key=True)  # the origin cluster, whose agent saw the Job
    uid: Mapped[str] = mapped_column(Text, primary_key=True)  # metadata.uid of the Job there
    job_id: Mapped[int] = mapped_column(BigInteger, unique=True)
    namespace: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Schedule(Base):
    """A recurring job: a cron expression and a job template (the Schedule document), fired by the scheduling
    leader (services/recurring.py). Jobs it started are named by id in recent_job_ids, read by primary key:
    the jobs table carries nothing of schedules but each job's labels."""

    __tablename__ = "schedules"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    owner: Mapped[str] = mapped_column(Text)  # the subject whose jobs these are
    owner_role: Mapped[str] = mapped_column(Text)  # its role when it created the schedule: admin | user
    spec: Mapped[dict] = mapped_column()  # the Schedule document, canonical (sluice.schedules)
    suspended: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    last_scheduled_at: Mapped[datetime | None] = mapped_column(nullable=True)  # last due time started or skipped
    next_due_at: Mapped[datetime | None] = mapped_column(nullable=True)  # the first due time after it
    recent_job_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), server_default=text("'{}'::bigint[]"))
    status: Mapped[str] = mapped_column(Text, server_default="")  # what it did or skipped last, for people
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why its last start failed
    last_error_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = _now()

    __table_args__ = (Index("ix_schedules_next_due_at", "next_due_at", postgresql_where=text("NOT suspended")),)


class BurstPolicy(Base):
    __tablename__ = "burst_policies"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    spec: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))  # the BurstPolicy object's document
    created_at: Mapped[datetime] = _now()


class AuditRecord(Base):
    """Every admin change: who, when, what (the object before and after, or the command's arguments)."""

    __tablename__ = "admin_audit"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    at: Mapped[datetime] = _now()
    actor: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)  # create | update | delete | quota-set | add-member | ...
    kind: Mapped[str] = mapped_column(Text)  # Queue | ServiceClass | Cluster | BurstPolicy | Token
    name: Mapped[str] = mapped_column(Text)
    details: Mapped[dict] = mapped_column(server_default=text("'{}'::jsonb"))

    __table_args__ = (Index("ix_admin_audit_at", "at"),)


def sql_strings(values) -> str:
    """A SQL list of constant strings, sorted: ('DISPATCHED', 'RUNNING') for states.ACTIVE. Statements name
    states through this and the constants of policy/states.py, never as literals of their own."""
    return "(" + ", ".join(f"'{v}'" for v in sorted(values)) + ")"
