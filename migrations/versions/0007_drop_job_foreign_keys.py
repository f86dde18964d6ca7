"""Drop the foreign keys of attempts, job_events and outbox to jobs: each was a per-row trigger (a
locking read of the job's row) on every submit, dispatch and report, and none could ever fire. Jobs are
never deleted, and every row of those tables is written by a statement that read or wrote its job's row
in the same transaction (store.lifecycle: submit, dispatch, apply_transitions; store.outbox). The foreign
keys to clusters, queues and service classes stay: those objects can be deleted, and the references
keep them (administering.delete).

Revision ID: 0007
Revises: 0006
"""
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

DROPPED = (("attempts", "attempts_job_id_fkey"), ("job_events", "job_events_job_id_fkey"),
           ("outbox", "outbox_job_id_fkey"))


def upgrade() -> None:
    for table, name in DROPPED:
        op.drop_constraint(name, table, type_="foreignkey")


def downgrade() -> None:
    for table, name in DROPPED:
        op.create_foreign_key(name, table, "jobs", ["job_id"], ["id"])
