"""intake_jobs: Kubernetes Jobs submitted through a cluster's API server (kubectl), one Sluice job per
(cluster, Job uid) for ever

Revision ID: 0015
Revises: 0014
"""
from alembic import op
import sqlalchemy as sa

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'intake_jobs',
        sa.Column('cluster', sa.Text(), nullable=False),
        sa.Column('uid', sa.Text(), nullable=False),
        sa.Column('job_id', sa.BigInteger(), nullable=False),
        sa.Column('namespace', sa.Text(), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('cluster', 'uid'),
        sa.UniqueConstraint('job_id'),
    )


def downgrade() -> None:
    op.drop_table('intake_jobs')
