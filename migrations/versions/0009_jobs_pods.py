"""jobs.pods: a job's pods as placement packs them onto nodes, [[count, per-pod requests], ...] per pod set,
written at submit for a job of more than one pod (NULL for one pod, and for jobs submitted before: placement
then judges by the total and the largest pod alone)

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('pods', postgresql.JSONB(astext_type=sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'pods')
