"""clusters.prometheus_capacity and prometheus_at: capacity read from Prometheus

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('clusters', sa.Column('prometheus_capacity', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('clusters', sa.Column('prometheus_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('clusters', 'prometheus_at')
    op.drop_column('clusters', 'prometheus_capacity')
