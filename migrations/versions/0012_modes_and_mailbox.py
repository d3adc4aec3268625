"""modes: a test-mode balance per account, mode of alerts and agents, canonical mailbox

* ``accounts.test_balance_micros``: the cached test-mode balance (ledger ``acct_test:<id>``),
  kept by the same conditional UPDATE as ``balance_micros`` and never negative.
* ``alerts.mode`` / ``agents.mode``: the mode of the key that created them; a key of the
  other mode can neither see nor change them. Existing rows are live.
* ``accounts.mailbox``: the canonical mailbox of the e-mail address (one promotional grant
  per mailbox), filled for existing human accounts by the same canonicalisation as
  ``app.services.accounts.mailbox.canonical``.

Revision ID: modes
Revises: external_credits
Create Date: 2026-12-05 10:00:00.000000

"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = 'modes'
down_revision = 'external_credits'
branch_labels = None
depends_on = None

_DOTLESS = ("gmail.com", "googlemail.com")


def _canonical(email: str) -> str:
    # Frozen copy of app.services.accounts.mailbox.canonical at this revision.
    local, _, domain = email.strip().lower().rpartition("@")
    local = local.split("+", 1)[0]
    if domain in _DOTLESS:
        local, domain = local.replace(".", ""), "gmail.com"
    return f"{local}@{domain}"


def upgrade():
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('test_balance_micros', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('mailbox', sa.String(length=320), nullable=True))
        batch_op.create_index(batch_op.f('ix_accounts_mailbox'), ['mailbox'], unique=False)
        batch_op.create_check_constraint(op.f('ck_accounts_test_balance_nonnegative'), 'test_balance_micros >= 0')
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('mode', sa.String(length=8), server_default='live', nullable=False))
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('mode', sa.String(length=8), server_default='live', nullable=False))
    conn = op.get_bind()
    accounts = sa.table('accounts', sa.column('id', sa.String), sa.column('email', sa.String),
                        sa.column('mailbox', sa.String))
    for acct_id, email in conn.execute(sa.select(accounts.c.id, accounts.c.email)
                                       .where(accounts.c.email.isnot(None))).all():
        conn.execute(accounts.update().where(accounts.c.id == acct_id).values(mailbox=_canonical(email)))


def downgrade():
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_column('mode')
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_column('mode')
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_accounts_test_balance_nonnegative'), type_='check')
        batch_op.drop_index(batch_op.f('ix_accounts_mailbox'))
        batch_op.drop_column('mailbox')
        batch_op.drop_column('test_balance_micros')
