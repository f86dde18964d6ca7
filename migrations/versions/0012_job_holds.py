"""jobs that wait (startAfter, dependsOn, array parallelism), job arrays, and when a session was last attached to

Revision ID: 0012
Revises: 0011
"""
from alembic import op
import sqlalchemy as sa

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('hold', sa.Text(), nullable=True))
    op.add_column('jobs', sa.Column('start_after', sa.DateTime(timezone=True), nullable=True))
    op.add_column('jobs', sa.Column('array_id', sa.BigInteger(), nullable=True))
    op.add_column('jobs', sa.Column('array_index', sa.Integer(), nullable=True))
    op.add_column('jobs', sa.Column('attached_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_jobs_waiting', 'jobs', ['hold', 'start_after', 'id'],
                    postgresql_where=sa.text("state = 'WAITING'"))
    op.create_index("ix_jobs_array", "jobs", ["array_id", "state", "array_index"],
                    postgresql_where=sa.text("array_id IS NOT NULL"))
    op.create_table(
        'job_arrays',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.Column('parallelism', sa.Integer(), nullable=True),
        sa.Column('first_index', sa.Integer(), server_default='0', nullable=False),
        sa.Column('waiting', sa.Boolean(), server_default='false', nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_job_arrays_waiting', 'job_arrays', ['id'], postgresql_where=sa.text('waiting'))
    op.create_table(
        'job_dependencies',
        sa.Column('job_id', sa.BigInteger(), nullable=False),
        sa.Column('depends_on', sa.BigInteger(), nullable=False),
        sa.Column('condition', sa.Text(), nullable=False),
        sa.Column('met', sa.Boolean(), nullable=True),
        sa.PrimaryKeyConstraint('job_id', 'depends_on'),
    )
    op.create_index('ix_job_dependencies_open', 'job_dependencies', ['depends_on'],
                    postgresql_where=sa.text('met IS NULL'))
    op.create_index('ix_job_dependencies_on', 'job_dependencies', ['depends_on'])


def downgrade() -> None:
    op.drop_table('job_dependencies')
    op.drop_table('job_arrays')
    op.drop_index('ix_jobs_array', table_name='jobs')
    op.drop_index('ix_jobs_waiting', table_name='jobs')
    for column in ('attached_at', 'array_index', 'array_id', 'start_after', 'hold'):
        op.drop_column('jobs', column)
