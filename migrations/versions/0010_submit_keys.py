"""submit_keys: each submit's idempotency key, per user, with the ids it committed and a digest of its
documents, so that a retry answers those ids and creates nothing; pruned after a day (created_at)

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'submit_keys',
        sa.Column('subject', sa.Text(), nullable=False),
        sa.Column('key', sa.Text(), nullable=False),
        sa.Column('digest', sa.Text(), nullable=False),
        sa.Column('ids', postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('subject', 'key', name='submit_keys_pkey'),
    )
    op.create_index('ix_submit_keys_created_at', 'submit_keys', ['created_at'], postgresql_using='brin')


def downgrade() -> None:
    op.drop_index('ix_submit_keys_created_at', table_name='submit_keys')
    op.drop_table('submit_keys')
