"""ix_jobs_active_usage: the scheduling cycle sums what runs per queue (store.cycle_reads.active_usage) from
this index alone, (queue, requests) of dispatched and running jobs, instead of reading every active
job's row

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_jobs_active_usage', 'jobs', ['queue', 'requests'], unique=False,
                    postgresql_where=sa.text("state IN ('DISPATCHED', 'RUNNING')"))


def downgrade() -> None:
    op.drop_index('ix_jobs_active_usage', table_name='jobs',
                  postgresql_where=sa.text("state IN ('DISPATCHED', 'RUNNING')"))
