"""attempts.address: how to reach a running attempt's first pod (`10.1.2.3:8888`), as its agent said,
for `sluice describe` (interactive sessions); NULL while unknown

Revision ID: 0014
Revises: 0013
"""
from alembic import op
import sqlalchemy as sa

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable without a default: adding it rewrites no row.
    op.add_column('attempts', sa.Column('address', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('attempts', 'address')
