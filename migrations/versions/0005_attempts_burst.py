"""attempts.burst: the burst decision that sent an attempt to a paid cluster (its trigger, the
alternatives, the expected cost), read back for budgets, `sluice explain` and `sluice usage`

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('attempts', sa.Column('burst', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    # Budgets read the burst attempts still running or finished since the budget day began, every cycle.
    op.create_index('ix_attempts_burst_finished', 'attempts', ['finished_at'],
                    postgresql_where=sa.text('burst IS NOT NULL'))


def downgrade() -> None:
    op.drop_index('ix_attempts_burst_finished', table_name='attempts')
    op.drop_column('attempts', 'burst')
