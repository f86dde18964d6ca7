"""jobs.preempted_by: the job that evicted a job's last attempt (no preemption loops)

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('preempted_by', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'preempted_by')
