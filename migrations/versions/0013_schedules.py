"""schedules: recurring jobs (a cron expression and a job template), fired by the scheduling leader

Revision ID: 0013
Revises: 0012
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'schedules',
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('owner', sa.Text(), nullable=False),
        sa.Column('owner_role', sa.Text(), nullable=False),
        sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('suspended', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.Column('last_scheduled_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('next_due_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('recent_job_ids', postgresql.ARRAY(sa.BigInteger()), server_default=sa.text("'{}'::bigint[]"),
                  nullable=False),
        sa.Column('status', sa.Text(), server_default='', nullable=False),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('last_error_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('name', name='schedules_pkey'),
    )
    op.create_index('ix_schedules_next_due_at', 'schedules', ['next_due_at'],
                    postgresql_where=sa.text('NOT suspended'))


def downgrade() -> None:
    op.drop_index('ix_schedules_next_due_at', table_name='schedules')
    op.drop_table('schedules')
