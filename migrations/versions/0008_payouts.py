"""payouts: module owners beyond agents, payout destinations, payouts

* ``modules.owner_account_id``: a catalog module owned by an account (or organisation),
  which earns the owner's share like an agent-owned module (``earnings:<account id>``).
* ``agent_settlements``: a statement is of an agent (``agent_id``) or of an owner account
  (``owner_account_id``); unique per owner account and month as per agent and month.
* ``payout_destinations``: where an owner's settled earnings are paid out (one per
  account): a Stripe Connect account or a USDC address on a supported chain. None: the
  earnings stay as balance (the default).
* ``payouts``: one row per payout; at most one open (pending, sending, failed) per account
  (unique partial index); ``processor_ref`` (the transfer id / transaction hash) unique.

Revision ID: payouts
Revises: invoices
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "payouts"
down_revision = "invoices"
branch_labels = None
depends_on = None

_OPEN = sa.text("status IN ('pending', 'sending', 'failed')")


def upgrade():
    op.add_column("modules", sa.Column("owner_account_id", sa.String(32), sa.ForeignKey("accounts.id"),
                                       nullable=True))
    op.create_index("ix_modules_owner_account_id", "modules", ["owner_account_id"])
    op.alter_column("agent_settlements", "agent_id", existing_type=sa.String(32), nullable=True)
    op.add_column("agent_settlements", sa.Column("owner_account_id", sa.String(32), sa.ForeignKey("accounts.id"),
                                                 nullable=True))
    op.create_unique_constraint("uq_agent_settlements_owner_month", "agent_settlements",
                                ["owner_account_id", "month"])
    op.create_check_constraint("ck_agent_settlements_one_owner", "agent_settlements",
                               "(agent_id IS NULL) <> (owner_account_id IS NULL)")
    op.create_table(
        "payout_destinations",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.String(120), nullable=False),
        sa.Column("chain", sa.String(16), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False))
    op.create_table(
        "payouts",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.String(120), nullable=False),
        sa.Column("chain", sa.String(16), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("processor_ref", sa.String(200), nullable=True, unique=True),
        sa.Column("failure_code", sa.String(64), nullable=True),
        sa.Column("failure_message", sa.String(300), nullable=True),
        sa.Column("ledger_txn_id", sa.BigInteger(), nullable=True),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        sa.Column("paid_at", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False))
    op.create_index("uq_payouts_open", "payouts", ["account_id"], unique=True, postgresql_where=_OPEN)
    op.create_index("ix_payouts_account", "payouts", ["account_id", "created_at"])
    op.create_index("ix_payouts_due", "payouts", ["next_attempt_at"], postgresql_where=_OPEN)


def downgrade():
    op.drop_table("payouts")
    op.drop_table("payout_destinations")
    op.drop_constraint("ck_agent_settlements_one_owner", "agent_settlements", type_="check")
    op.drop_constraint("uq_agent_settlements_owner_month", "agent_settlements", type_="unique")
    op.drop_column("agent_settlements", "owner_account_id")
    op.alter_column("agent_settlements", "agent_id", existing_type=sa.String(32), nullable=False)
    op.drop_index("ix_modules_owner_account_id", table_name="modules")
    op.drop_column("modules", "owner_account_id")
