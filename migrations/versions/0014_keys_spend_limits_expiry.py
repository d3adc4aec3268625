"""keys: per-key spend limits (key_spend counters), expiry and rotation

Adds ``api_keys.expires_at``, ``spend_limit_micros``, ``spend_limit_period`` and
``rotated_to``; the ``key_spend`` counters (one row per key and limit period); and
``spend_key_id`` on module calls and chat completions (whose limit a charge was reserved
against, so a refund gives the room back). Existing keys get no limit and no expiry.

Revision ID: keys
Revises: hot_path
Create Date: 2026-12-01 10:00:00.000000

"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = 'keys'
down_revision = 'hot_path'
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade():
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expires_at', TS, nullable=True))
        batch_op.add_column(sa.Column('spend_limit_micros', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('spend_limit_period', sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column('rotated_to', sa.String(length=32), nullable=True))
    op.create_table('key_spend',
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('period_start', TS, nullable=False),
    sa.Column('spent_micros', sa.BigInteger(), nullable=False),
    sa.CheckConstraint('spent_micros >= 0', name=op.f('ck_key_spend_spent_nonnegative')),
    sa.PrimaryKeyConstraint('key_id', 'period_start', name=op.f('pk_key_spend'))
    )
    with op.batch_alter_table('module_calls', schema=None) as batch_op:
        batch_op.add_column(sa.Column('spend_key_id', sa.String(length=32), nullable=True))
    with op.batch_alter_table('chat_completions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('spend_key_id', sa.String(length=32), nullable=True))


def downgrade():
    with op.batch_alter_table('chat_completions', schema=None) as batch_op:
        batch_op.drop_column('spend_key_id')
    with op.batch_alter_table('module_calls', schema=None) as batch_op:
        batch_op.drop_column('spend_key_id')
    op.drop_table('key_spend')
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_column('rotated_to')
        batch_op.drop_column('spend_limit_period')
        batch_op.drop_column('spend_limit_micros')
        batch_op.drop_column('expires_at')
