"""single-use tokens: one table for every purpose

``single_use_tokens`` replaces agent_nonces, wallet_nonces, signup_requests and the
token columns of subscriptions: every single-use token (agent sign-in nonce,
wallet-connect nonce, sign-up link, newsletter confirmation) lives there, stored as
SHA-256 only and consumed by one conditional UPDATE (app/services/platform/tokens.py).

Tokens in flight when this runs are dropped, not copied, in both directions: they live
minutes (nonces: 5 minutes) to hours (sign-up and newsletter links: hours), the old wallet
nonces were stored in plain text and cannot be carried over into the new keyed
derivation, and whoever holds one simply asks for a new one. Pending newsletter subscriptions stay
``pending``; their holders re-subscribe to get a fresh link.

Revision ID: tokens
Revises: payments
Create Date: 2026-11-28 10:00:00.000000

"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = 'tokens'
down_revision = 'payments'
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BIGPK = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table('single_use_tokens',
    sa.Column('id', BIGPK, autoincrement=True, nullable=False),
    sa.Column('purpose', sa.String(length=32), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('subject', sa.String(length=200), nullable=True),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', TS, nullable=False),
    sa.Column('expires_at', TS, nullable=False),
    sa.Column('used_at', TS, nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_single_use_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_single_use_tokens_token_hash'))
    )
    with op.batch_alter_table('single_use_tokens', schema=None) as batch_op:
        batch_op.create_index('ix_single_use_tokens_purpose_subject', ['purpose', 'subject'], unique=False)
        batch_op.create_index(batch_op.f('ix_single_use_tokens_expires_at'), ['expires_at'], unique=False)

    with op.batch_alter_table('agent_nonces', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agent_nonces_expires_at'))
    op.drop_table('agent_nonces')
    with op.batch_alter_table('wallet_nonces', schema=None) as batch_op:
        batch_op.drop_index('ix_wallet_nonces_lookup')
    op.drop_table('wallet_nonces')
    with op.batch_alter_table('signup_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_signup_requests_email')
    op.drop_table('signup_requests')
    with op.batch_alter_table('subscriptions', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_subscriptions_token_hash'), type_='unique')
        batch_op.drop_column('token_expires_at')
        batch_op.drop_column('token_hash')


def downgrade():
    with op.batch_alter_table('subscriptions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('token_hash', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('token_expires_at', TS, nullable=True))
        batch_op.create_unique_constraint(batch_op.f('uq_subscriptions_token_hash'), ['token_hash'])

    op.create_table('signup_requests',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('expires_at', TS, nullable=False),
    sa.Column('used_at', TS, nullable=True),
    sa.Column('account_id', sa.String(length=32), nullable=True),
    sa.Column('created_at', TS, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_signup_requests')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_signup_requests_token_hash'))
    )
    with op.batch_alter_table('signup_requests', schema=None) as batch_op:
        batch_op.create_index('ix_signup_requests_email', ['email'], unique=False)

    op.create_table('wallet_nonces',
    sa.Column('nonce', sa.String(length=40), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('chain', sa.String(length=16), nullable=False),
    sa.Column('address', sa.String(length=64), nullable=False),
    sa.Column('address_key', sa.String(length=64), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('expires_at', TS, nullable=False),
    sa.Column('used_at', TS, nullable=True),
    sa.Column('created_at', TS, nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_wallet_nonces_account_id_accounts')),
    sa.PrimaryKeyConstraint('nonce', name=op.f('pk_wallet_nonces'))
    )
    with op.batch_alter_table('wallet_nonces', schema=None) as batch_op:
        batch_op.create_index('ix_wallet_nonces_lookup', ['account_id', 'chain', 'address_key'], unique=False)

    op.create_table('agent_nonces',
    sa.Column('id', BIGPK, autoincrement=True, nullable=False),
    sa.Column('nonce_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', TS, nullable=False),
    sa.Column('expires_at', TS, nullable=False),
    sa.Column('used_at', TS, nullable=True),
    sa.Column('agent_id', sa.String(length=32), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agent_nonces')),
    sa.UniqueConstraint('nonce_hash', name=op.f('uq_agent_nonces_nonce_hash'))
    )
    with op.batch_alter_table('agent_nonces', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agent_nonces_expires_at'), ['expires_at'], unique=False)

    with op.batch_alter_table('single_use_tokens', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_single_use_tokens_expires_at'))
        batch_op.drop_index('ix_single_use_tokens_purpose_subject')
    op.drop_table('single_use_tokens')
