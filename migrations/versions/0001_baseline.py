"""baseline: the whole schema (PostgreSQL), replacing the 28 migrations up to
``grouped_open_lock_wait`` (issue 36)

Tables in model order as autogenerate writes them, with the columns in the order the old
migrations left them, plus what autogenerate does not write: the call log
(``module_calls``, ``chat_completions``) and the ledger legs (``ledger_entries``)
partitioned by RANGE (created_at) with primary key ``(id, created_at)``, a DEFAULT
partition and the monthly partitions (``<table>_pYYYY_MM``) of this month and the next
``AHEAD`` (app/services/platform/partitions.py keeps creating them); the pending calls'
partial indexes; ``idempotency_records`` with fillfactor 40 (the finalize's update stays
on the row's page: bench/DIARY.md, "Room for the finalize's rewrite").

The PostgreSQL functions are not here: each is a ``.sql`` file installed from that file
(app/sqlfunctions.py; migrations/env.py installs them after every upgrade). This
migration only installs ``gw_create_month_partition`` first, to make the partitions.

Revision ID: baseline
Revises:
Create Date: 2026-11-27 19:00:00.000000
"""
from datetime import date, datetime, timezone

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from app import sqlfunctions

revision = "baseline"
down_revision = None
branch_labels = None
depends_on = None

PARTITIONED = ("module_calls", "chat_completions", "ledger_entries")
AHEAD = 3  # monthly partitions made ahead of the current one
PENDING = "status = 'pending'"
PENDING_INDEXES = (("ix_module_calls_pending_created", "created_at", "pending_created"),
                   ("ix_module_calls_pending_deadline", "deadline_at", "pending_deadline"))


def _plus_months(d: date, n: int) -> date:
    y, m = divmod(d.month - 1 + n, 12)
    return date(d.year + y, m + 1, 1)


def _partitions(conn, table: str) -> list[str]:
    return conn.execute(sa.text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = CAST(:t AS regclass) ORDER BY 1"), {"t": table}).scalars().all()


def upgrade():
    op.create_table('accounts',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=True),
    sa.Column('plan', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('is_admin', sa.Boolean(), nullable=False),
    sa.Column('agent_id', sa.String(length=32), nullable=True),
    sa.Column('owner_account_id', sa.String(length=32), nullable=True),
    sa.Column('balance_micros', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('test_balance_micros', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('mailbox', sa.String(length=320), nullable=True),
    sa.CheckConstraint('balance_micros >= 0', name=op.f('ck_accounts_balance_nonnegative')),
    sa.CheckConstraint('test_balance_micros >= 0', name=op.f('ck_accounts_test_balance_nonnegative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_accounts')),
    sa.UniqueConstraint('email', name=op.f('uq_accounts_email'))
    )
    op.create_index(op.f('ix_accounts_agent_id'), 'accounts', ['agent_id'], unique=False)
    op.create_index(op.f('ix_accounts_mailbox'), 'accounts', ['mailbox'], unique=False)
    op.create_index(op.f('ix_accounts_owner_account_id'), 'accounts', ['owner_account_id'], unique=False)

    op.create_table('alert_events',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('alert_id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('metric', sa.String(length=16), nullable=False),
    sa.Column('op', sa.String(length=2), nullable=False),
    sa.Column('threshold', sa.Float(), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('window', sa.String(length=8), nullable=False),
    sa.Column('channel', sa.String(length=8), nullable=False),
    sa.Column('period_key', sa.String(length=16), nullable=False),
    sa.Column('fired_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_events')),
    sa.UniqueConstraint('alert_id', 'period_key', name='uq_alert_events_alert_period')
    )
    op.create_index('ix_alert_events_account_fired', 'alert_events', ['account_id', 'fired_at'], unique=False)

    op.create_table('alerts',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('metric', sa.String(length=16), nullable=False),
    sa.Column('op', sa.String(length=2), nullable=False),
    sa.Column('threshold', sa.Float(), nullable=False),
    sa.Column('window', sa.String(length=8), nullable=False),
    sa.Column('channel', sa.String(length=8), nullable=False),
    sa.Column('target', sa.String(length=2000), nullable=False),
    sa.Column('secret', sa.String(length=80), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('mode', sa.String(length=8), server_default='live', nullable=False),
    sa.Column('status', sa.String(length=24), server_default='active', nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alerts'))
    )
    op.create_index('ix_alerts_account_active', 'alerts', ['account_id', 'deleted_at'], unique=False)

    op.create_table('chain_cursors',
    sa.Column('chain', sa.String(length=16), nullable=False),
    sa.Column('last_block', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('chain', name=op.f('pk_chain_cursors'))
    )
    op.create_table('chat_completions',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('requested_model', sa.String(length=96), nullable=False),
    sa.Column('model', sa.String(length=96), nullable=True),
    sa.Column('provider', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('stream', sa.Boolean(), nullable=False),
    sa.Column('hold_micros', sa.BigInteger(), nullable=False),
    sa.Column('cost_micros', sa.BigInteger(), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), nullable=False),
    sa.Column('usage_estimated', sa.Boolean(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('latency_ms', sa.Integer(), nullable=False),
    sa.Column('error', sa.String(length=300), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('settled_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('alive_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('spend_key_id', sa.String(length=32), nullable=True),
    sa.PrimaryKeyConstraint('id', 'created_at', name=op.f('pk_chat_completions')),
    postgresql_partition_by='RANGE (created_at)'
    )
    op.create_index('ix_chat_completions_account_created', 'chat_completions', ['account_id', 'created_at'], unique=False)
    op.create_index('ix_chat_completions_settled_at', 'chat_completions', ['settled_at'], unique=False)
    op.create_index('ix_chat_completions_status_created', 'chat_completions', ['status', 'created_at'], unique=False)

    op.create_table('contact_messages',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('client_ip', sa.String(length=64), nullable=True),
    sa.Column('outbox_id', sa.String(length=32), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_contact_messages'))
    )
    op.create_index(op.f('ix_contact_messages_email'), 'contact_messages', ['email'], unique=False)

    op.create_table('idempotency_records',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('call_id', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('response_body', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_idempotency_records')),
    sa.UniqueConstraint('account_id', 'key', name='uq_idempotency_records_account_key'),
    postgresql_with={'fillfactor': 40}
    )
    op.create_index(op.f('ix_idempotency_records_expires_at'), 'idempotency_records', ['expires_at'], unique=False)

    op.create_table('key_spend',
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('spent_micros', sa.BigInteger(), nullable=False),
    sa.CheckConstraint('spent_micros >= 0', name=op.f('ck_key_spend_spent_nonnegative')),
    sa.PrimaryKeyConstraint('key_id', 'period_start', name=op.f('pk_key_spend'))
    )
    op.create_table('ledger_transactions',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('ref', sa.String(length=160), nullable=True),
    sa.Column('account_id', sa.String(length=32), nullable=True),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger_transactions')),
    sa.UniqueConstraint('ref', name=op.f('uq_ledger_transactions_ref'))
    )
    op.create_table('module_calls',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('module_id', sa.Integer(), nullable=False),
    sa.Column('module_slug', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('price_micros', sa.BigInteger(), nullable=False),
    sa.Column('charged', sa.Boolean(), nullable=False),
    sa.Column('owner_agent_id', sa.String(length=32), nullable=True),
    sa.Column('idempotency_key', sa.String(length=128), nullable=True),
    sa.Column('ok', sa.Boolean(), nullable=True),
    sa.Column('provider_status', sa.Integer(), nullable=True),
    sa.Column('error', sa.String(length=32), nullable=True),
    sa.Column('receipt', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deadline_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('spend_key_id', sa.String(length=32), nullable=True),
    sa.PrimaryKeyConstraint('id', 'created_at', name=op.f('pk_module_calls')),
    postgresql_partition_by='RANGE (created_at)'
    )
    op.create_index('ix_module_calls_account_created', 'module_calls', ['account_id', 'created_at'], unique=False)
    op.create_index('ix_module_calls_created_at', 'module_calls', ['created_at'], unique=False)

    op.create_table('modules',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('slug', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=120), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('owner', sa.String(length=120), nullable=False),
    sa.Column('owner_agent_id', sa.String(length=32), nullable=True),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('upstream_url', sa.String(length=500), nullable=False),
    sa.Column('sandbox_url', sa.String(length=500), nullable=True),
    sa.Column('provider_auth', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_modules')),
    sa.UniqueConstraint('slug', name=op.f('uq_modules_slug'))
    )
    op.create_index(op.f('ix_modules_owner_agent_id'), 'modules', ['owner_agent_id'], unique=False)

    op.create_table('outbox',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('channel', sa.String(length=16), nullable=False),
    sa.Column('destination', sa.String(length=2000), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('source', sa.String(length=120), nullable=True),
    sa.Column('account_id', sa.String(length=32), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_outbox'))
    )
    op.create_index(op.f('ix_outbox_account_id'), 'outbox', ['account_id'], unique=False)
    op.create_index(op.f('ix_outbox_source'), 'outbox', ['source'], unique=False)
    op.create_index('ix_outbox_status_next', 'outbox', ['status', 'next_attempt_at'], unique=False)

    op.create_table('payment_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('processor', sa.String(length=16), nullable=False),
    sa.Column('event_id', sa.String(length=120), nullable=False),
    sa.Column('type', sa.String(length=80), nullable=False),
    sa.Column('payment_id', sa.String(length=32), nullable=True),
    sa.Column('outcome', sa.String(length=32), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_payment_events')),
    sa.UniqueConstraint('event_id', name=op.f('uq_payment_events_event_id'))
    )
    op.create_index(op.f('ix_payment_events_payment_id'), 'payment_events', ['payment_id'], unique=False)

    op.create_table('single_use_tokens',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('purpose', sa.String(length=32), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('subject', sa.String(length=200), nullable=True),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('used_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_single_use_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_single_use_tokens_token_hash'))
    )
    op.create_index(op.f('ix_single_use_tokens_expires_at'), 'single_use_tokens', ['expires_at'], unique=False)
    op.create_index('ix_single_use_tokens_purpose_subject', 'single_use_tokens', ['purpose', 'subject'], unique=False)

    op.create_table('subscriptions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=False),
    sa.Column('list', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('confirmed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('unsubscribed_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_subscriptions')),
    sa.UniqueConstraint('email', 'list', name='uq_subscriptions_email_list')
    )
    op.create_index(op.f('ix_subscriptions_email'), 'subscriptions', ['email'], unique=False)

    op.create_table('track_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('event', sa.String(length=64), nullable=False),
    sa.Column('session_id', sa.String(length=128), nullable=True),
    sa.Column('account_id', sa.String(length=32), nullable=True),
    sa.Column('props', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_track_events'))
    )
    op.create_index('ix_track_events_account_created', 'track_events', ['account_id', 'created_at'], unique=False)
    op.create_index('ix_track_events_created_at', 'track_events', ['created_at'], unique=False)
    op.create_index('ix_track_events_event_created', 'track_events', ['event', 'created_at'], unique=False)
    op.create_index('ix_track_events_session_created', 'track_events', ['session_id', 'created_at'], unique=False)

    op.create_table('usage_daily',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('product', sa.String(length=96), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('day', sa.DateTime(timezone=True), nullable=False),
    sa.Column('calls', sa.BigInteger(), nullable=False),
    sa.Column('errors', sa.BigInteger(), nullable=False),
    sa.Column('spend_micros', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_daily')),
    sa.UniqueConstraint('account_id', 'product', 'mode', 'day', name='uq_usage_daily_key')
    )
    op.create_index('ix_usage_daily_account_mode_day', 'usage_daily', ['account_id', 'mode', 'day'], unique=False, postgresql_include=['product', 'calls', 'errors', 'spend_micros'])

    op.create_table('usage_hourly',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('product', sa.String(length=96), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
    sa.Column('calls', sa.Integer(), nullable=False),
    sa.Column('errors', sa.Integer(), nullable=False),
    sa.Column('spend_micros', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_hourly')),
    sa.UniqueConstraint('account_id', 'product', 'mode', 'hour', name='uq_usage_hourly_key')
    )
    op.create_index('ix_usage_hourly_account_mode_hour', 'usage_hourly', ['account_id', 'mode', 'hour'], unique=False, postgresql_include=['product', 'calls', 'errors', 'spend_micros'])
    op.create_index('ix_usage_hourly_hour', 'usage_hourly', ['hour'], unique=False, postgresql_include=['account_id', 'product', 'mode', 'calls', 'errors', 'spend_micros'])

    op.create_table('usage_rollup_state',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('rolled_through', sa.DateTime(timezone=True), nullable=False),
    sa.Column('days_rolled_through', sa.DateTime(timezone=True), nullable=True),
    sa.Column('tail_through', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_rollup_state'))
    )
    op.create_table('agents',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('pubkey', sa.String(length=64), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('owner_account_id', sa.String(length=32), nullable=False),
    sa.Column('webhook', sa.String(length=2000), nullable=True),
    sa.Column('webhook_secret', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('mode', sa.String(length=8), server_default='live', nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_agents_account_id_accounts')),
    sa.ForeignKeyConstraint(['owner_account_id'], ['accounts.id'], name=op.f('fk_agents_owner_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agents')),
    sa.UniqueConstraint('account_id', name=op.f('uq_agents_account_id')),
    sa.UniqueConstraint('pubkey', name=op.f('uq_agents_pubkey'))
    )
    op.create_index(op.f('ix_agents_owner_account_id'), 'agents', ['owner_account_id'], unique=False)

    op.create_table('api_keys',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('prefix', sa.String(length=24), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('scopes', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('spend_limit_micros', sa.BigInteger(), nullable=True),
    sa.Column('spend_limit_period', sa.String(length=8), nullable=True),
    sa.Column('rotated_to', sa.String(length=32), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_api_keys_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    op.create_index(op.f('ix_api_keys_account_id'), 'api_keys', ['account_id'], unique=False)

    op.create_table('billing_profiles',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('processor', sa.String(length=16), nullable=False),
    sa.Column('customer_id', sa.String(length=120), nullable=True),
    sa.Column('payment_method_id', sa.String(length=120), nullable=True),
    sa.Column('payment_method_type', sa.String(length=32), nullable=True),
    sa.Column('brand', sa.String(length=40), nullable=True),
    sa.Column('last4', sa.String(length=4), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_billing_profiles_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_billing_profiles')),
    sa.UniqueConstraint('account_id', 'processor', name='uq_billing_profiles_account_processor')
    )
    op.create_index(op.f('ix_billing_profiles_account_id'), 'billing_profiles', ['account_id'], unique=False)

    op.create_table('external_credits',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('ref', sa.String(length=200), nullable=False),
    sa.Column('rail', sa.String(length=16), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('ledger_ref', sa.String(length=200), nullable=False),
    sa.Column('payment_id', sa.String(length=32), nullable=True),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_external_credits_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_external_credits')),
    sa.UniqueConstraint('ref', name=op.f('uq_external_credits_ref'))
    )
    op.create_index(op.f('ix_external_credits_account_id'), 'external_credits', ['account_id'], unique=False)

    op.create_table('ledger_entries',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('txn_id', sa.BigInteger(), nullable=False),
    sa.Column('ledger_account', sa.String(length=64), nullable=False),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['txn_id'], ['ledger_transactions.id'], name=op.f('fk_ledger_entries_txn_id_ledger_transactions')),
    sa.PrimaryKeyConstraint('id', 'created_at', name=op.f('pk_ledger_entries')),
    postgresql_partition_by='RANGE (created_at)'
    )
    op.create_index('ix_ledger_entries_account_created', 'ledger_entries', ['ledger_account', 'created_at'], unique=False)
    op.create_index(op.f('ix_ledger_entries_txn_id'), 'ledger_entries', ['txn_id'], unique=False)

    op.create_table('module_actions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('module_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('price_cents', sa.Integer(), nullable=False),
    sa.Column('method', sa.String(length=8), nullable=False),
    sa.Column('path', sa.String(length=300), nullable=False),
    sa.Column('timeout_seconds', sa.Float(), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['module_id'], ['modules.id'], name=op.f('fk_module_actions_module_id_modules')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_module_actions')),
    sa.UniqueConstraint('module_id', 'name', name='uq_module_actions_module_name')
    )
    op.create_index(op.f('ix_module_actions_module_id'), 'module_actions', ['module_id'], unique=False)

    op.create_table('payments',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('method', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('processor', sa.String(length=16), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('provider_id', sa.String(length=160), nullable=True),
    sa.Column('payment_intent', sa.String(length=120), nullable=True),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('refunded_micros', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('failure_code', sa.String(length=64), nullable=True),
    sa.Column('failure_message', sa.String(length=300), nullable=True),
    sa.Column('product', sa.String(length=200), nullable=True),
    sa.Column('return_url', sa.String(length=2000), nullable=True),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_payments_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_payments')),
    sa.UniqueConstraint('provider_id', name=op.f('uq_payments_provider_id'))
    )
    op.create_index('ix_payments_account_created', 'payments', ['account_id', 'created_at'], unique=False)
    op.create_index(op.f('ix_payments_payment_intent'), 'payments', ['payment_intent'], unique=False)
    op.create_index(op.f('ix_payments_status'), 'payments', ['status'], unique=False)

    op.create_table('wallets',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('chain', sa.String(length=16), nullable=False),
    sa.Column('address', sa.String(length=64), nullable=False),
    sa.Column('address_key', sa.String(length=64), nullable=False),
    sa.Column('connected_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_wallets_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_wallets')),
    sa.UniqueConstraint('account_id', name=op.f('uq_wallets_account_id')),
    sa.UniqueConstraint('address_key', name=op.f('uq_wallets_address_key'))
    )
    op.create_table('x402_authorizations',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('auth_key', sa.String(length=200), nullable=False),
    sa.Column('account_id', sa.String(length=32), nullable=False),
    sa.Column('network', sa.String(length=32), nullable=False),
    sa.Column('payer', sa.String(length=64), nullable=False),
    sa.Column('value_atomic', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('transaction', sa.String(length=100), nullable=True),
    sa.Column('error', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('settled_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('price_micros', sa.BigInteger(), nullable=True),
    sa.Column('valid_before', sa.BigInteger(), nullable=True),
    sa.Column('resource_url', sa.String(length=2000), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_x402_authorizations_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_x402_authorizations')),
    sa.UniqueConstraint('auth_key', name=op.f('uq_x402_authorizations_auth_key'))
    )
    op.create_index(op.f('ix_x402_authorizations_account_id'), 'x402_authorizations', ['account_id'], unique=False)

    op.create_table('agent_sessions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('agent_id', sa.String(length=32), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['agent_id'], ['agents.id'], name=op.f('fk_agent_sessions_agent_id_agents')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agent_sessions')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_agent_sessions_token_hash'))
    )
    op.create_index(op.f('ix_agent_sessions_agent_id'), 'agent_sessions', ['agent_id'], unique=False)
    op.create_index(op.f('ix_agent_sessions_expires_at'), 'agent_sessions', ['expires_at'], unique=False)

    op.create_table('agent_settlements',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('agent_id', sa.String(length=32), nullable=False),
    sa.Column('month', sa.String(length=7), nullable=False),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('ledger_txn_id', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['agent_id'], ['agents.id'], name=op.f('fk_agent_settlements_agent_id_agents')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agent_settlements')),
    sa.UniqueConstraint('agent_id', 'month', name='uq_agent_settlements_agent_month')
    )
    op.create_index(op.f('ix_agent_settlements_agent_id'), 'agent_settlements', ['agent_id'], unique=False)

    op.create_table('module_submissions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('agent_id', sa.String(length=32), nullable=False),
    sa.Column('slug', sa.String(length=64), nullable=False),
    sa.Column('pending_slug', sa.String(length=64), nullable=True),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('price_cents', sa.Integer(), nullable=False),
    sa.Column('actions', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('webhook', sa.String(length=2000), nullable=False),
    sa.Column('webhook_secret', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('review_notes', sa.Text(), nullable=True),
    sa.Column('reviewed_by', sa.String(length=120), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('reviewed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['agent_id'], ['agents.id'], name=op.f('fk_module_submissions_agent_id_agents')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_module_submissions')),
    sa.UniqueConstraint('pending_slug', name=op.f('uq_module_submissions_pending_slug'))
    )
    op.create_index('ix_module_submissions_agent_created', 'module_submissions', ['agent_id', 'created_at'], unique=False)
    op.create_index(op.f('ix_module_submissions_slug'), 'module_submissions', ['slug'], unique=False)

    # the call log and the ledger legs: a DEFAULT partition each, then this month's and the
    # next AHEAD months' (later ones: the partitions-ensure job, by the same function)
    conn = op.get_bind()
    sqlfunctions.install(conn, names=["gw_create_month_partition"])
    this_month = datetime.now(timezone.utc).date().replace(day=1)
    for table in PARTITIONED:
        op.execute(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT')
        for n in range(AHEAD + 1):
            conn.execute(sa.text("SELECT gw_create_month_partition(:t, :m)"),
                         {"t": table, "m": _plus_months(this_month, n)})
    # the pending calls' partial indexes: a partition's own index is named after it (the
    # index on the parent then attaches them; partitions made later get PostgreSQL's names)
    for index, column, suffix in PENDING_INDEXES:
        for part in _partitions(conn, "module_calls"):
            op.execute(f'CREATE INDEX "{part}_{suffix}" ON "{part}" ({column}) WHERE {PENDING}')
        op.create_index(index, 'module_calls', [column], unique=False, postgresql_where=sa.text(PENDING))


def downgrade():
    op.drop_table('module_submissions')
    op.drop_table('agent_settlements')
    op.drop_table('agent_sessions')
    op.drop_table('x402_authorizations')
    op.drop_table('wallets')
    op.drop_table('payments')
    op.drop_table('module_actions')
    op.drop_table('ledger_entries')
    op.drop_table('external_credits')
    op.drop_table('billing_profiles')
    op.drop_table('api_keys')
    op.drop_table('agents')
    op.drop_table('usage_rollup_state')
    op.drop_table('usage_hourly')
    op.drop_table('usage_daily')
    op.drop_table('track_events')
    op.drop_table('subscriptions')
    op.drop_table('single_use_tokens')
    op.drop_table('payment_events')
    op.drop_table('outbox')
    op.drop_table('modules')
    op.drop_table('module_calls')
    op.drop_table('ledger_transactions')
    op.drop_table('key_spend')
    op.drop_table('idempotency_records')
    op.drop_table('contact_messages')
    op.drop_table('chat_completions')
    op.drop_table('chain_cursors')
    op.drop_table('alerts')
    op.drop_table('alert_events')
    op.drop_table('accounts')
    sqlfunctions.uninstall(op.get_bind())
