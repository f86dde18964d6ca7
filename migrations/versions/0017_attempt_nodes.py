"""attempts.nodes: what a running attempt's pods hold on each node they are bound to ({node: {resource: milli}}),
as its agent said, so that preemption knows which room evicting it frees where; NULL while unknown

Revision ID: 0017
Revises: 0016
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable without a default: adding it rewrites no row.
    op.add_column('attempts', sa.Column('nodes', JSONB(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.drop_column('attempts', 'nodes')
