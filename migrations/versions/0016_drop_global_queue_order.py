"""Drop ix_jobs_queued_order: the cycle reads heads queue by queue (ix_jobs_queue_head), and with the global
index there the planner could read a queue's heads through it, filtering every other queue's backlog out
(a parent queue, which holds no jobs, then cost a scan of the whole backlog in every cycle)

Revision ID: 0016
Revises: 0015
"""
from alembic import op
import sqlalchemy as sa

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index('ix_jobs_queued_order', table_name='jobs', postgresql_where=sa.text("state = 'QUEUED'"))


def downgrade() -> None:
    op.create_index('ix_jobs_queued_order', 'jobs', [sa.text('class_priority DESC'), sa.text('priority DESC'), 'id'],
                    unique=False, postgresql_where=sa.text("state = 'QUEUED'"))
