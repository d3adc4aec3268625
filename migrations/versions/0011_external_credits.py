"""external credits: the one book of outside money; x402 reconciliation facts

``external_credits`` records every credit that came from outside under a reference
unique across all rails (Stripe, chain, x402, ACH). ``x402_authorizations`` gains the
payload, price and ``validBefore`` the reconciliation job needs to settle or release an
authorization left ``reserved``; ``chat_completions.alive_at`` is the heartbeat of the
request holding a chat hold (the stale-hold sweep never releases a live one). Existing credits are not back-filled: their ledger refs
(``pay:``, ``usdc:``, ``x402:``) stay unique as before.

Revision ID: external_credits
Revises: tokens
Create Date: 2026-12-05 10:00:00.000000

"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

revision = 'external_credits'
down_revision = 'tokens'
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BIGPK = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), 'postgresql')


def upgrade():
    op.create_table('external_credits',
    sa.Column('id', BIGPK, autoincrement=True, nullable=False),
    sa.Column('ref', sa.String(length=200), nullable=False),
    sa.Column('rail', sa.String(length=16), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('ledger_ref', sa.String(length=200), nullable=False),
    sa.Column('payment_id', sa.String(length=32), nullable=True),
    sa.Column('meta', JSON, nullable=True),
    sa.Column('created_at', TS, nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_external_credits_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_external_credits')),
    sa.UniqueConstraint('ref', name=op.f('uq_external_credits_ref'))
    )
    with op.batch_alter_table('external_credits', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_external_credits_account_id'), ['account_id'], unique=False)
    with op.batch_alter_table('x402_authorizations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('payload', JSON, nullable=True))
        batch_op.add_column(sa.Column('price_micros', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('valid_before', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('chat_completions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('alive_at', TS, nullable=True))


def downgrade():
    with op.batch_alter_table('chat_completions', schema=None) as batch_op:
        batch_op.drop_column('alive_at')
    with op.batch_alter_table('x402_authorizations', schema=None) as batch_op:
        batch_op.drop_column('valid_before')
        batch_op.drop_column('price_micros')
        batch_op.drop_column('payload')
    with op.batch_alter_table('external_credits', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_external_credits_account_id'))
    op.drop_table('external_credits')
