"""revoked_certificates: agents' client certificates that no longer authenticate them, by serial number

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'revoked_certificates',
        sa.Column('serial', sa.Text(), nullable=False),
        sa.Column('cluster', sa.Text(), nullable=True),
        sa.Column('not_after', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('serial', name='revoked_certificates_pkey'),
    )


def downgrade() -> None:
    op.drop_table('revoked_certificates')
