"""admin audit, burst policies, per-queue head index

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 06:18:29.496962
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('admin_audit',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('actor', sa.Text(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('details', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"),
              nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_admin_audit_at', 'admin_audit', ['at'], unique=False)
    op.create_table('burst_policies',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_index('ix_jobs_queue_head', 'jobs',
                    ['queue', sa.literal_column('class_priority DESC'), sa.literal_column('priority DESC'), 'id'],
                    unique=False, postgresql_where=sa.text("state = 'QUEUED'"))


def downgrade() -> None:
    op.drop_index('ix_jobs_queue_head', table_name='jobs', postgresql_where=sa.text("state = 'QUEUED'"))
    op.drop_table('burst_policies')
    op.drop_index('ix_admin_audit_at', table_name='admin_audit')
    op.drop_table('admin_audit')
