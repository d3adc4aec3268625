"""invoices: numbered, immutable invoices and the billing details they name

* ``invoices``: one per payment (``payment_id`` unique) and per account, mode and month of
  usage (``period`` unique per account and mode); append-only (trigger
  ``gw_invoices_append_only`` runs the ledger's ``gw_ledger_append_only``).
* ``invoice_counters``: the last number per seller and series, locked by the unit of work
  that issues an invoice (gap-free: no sequence).
* ``billing_details``: name, address, country and tax id an account sets for its invoices.
* ``ix_payments_created``: the invoice sweep's read of the last weeks' payments.

Revision ID: invoices
Revises: member_budgets
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime
from migrations.helpers import create_append_only_trigger, drop_append_only_trigger

revision = "invoices"
down_revision = "member_budgets"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "invoices",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("seller", sa.String(32), nullable=False),
        sa.Column("series", sa.String(8), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("number", sa.String(40), nullable=False),
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("payment_id", sa.String(32), nullable=True),
        sa.Column("period", sa.String(7), nullable=True),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("total_micros", sa.BigInteger(), nullable=False),
        sa.Column("document", sa.dialects.postgresql.JSONB(), nullable=False),
        sa.Column("issued_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("seller", "series", "seq", name="uq_invoices_number"),
    )
    op.create_index("uq_invoices_payment", "invoices", ["payment_id"], unique=True,
                    postgresql_where=sa.text("payment_id IS NOT NULL"))
    op.create_index("uq_invoices_usage_period", "invoices", ["account_id", "mode", "period"], unique=True,
                    postgresql_where=sa.text("kind = 'usage'"))
    op.create_index("ix_invoices_account", "invoices", ["account_id", "mode", "seq"])
    create_append_only_trigger("invoices")
    op.create_table(
        "invoice_counters",
        sa.Column("seller", sa.String(32), primary_key=True),
        sa.Column("series", sa.String(8), primary_key=True),
        sa.Column("last_number", sa.BigInteger(), nullable=False),
    )
    # the invoice sweep reads the last weeks' credited payments without an invoice
    op.create_index("ix_payments_created", "payments", ["created_at"])
    op.create_table(
        "billing_details",
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), primary_key=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("address", sa.String(1000), nullable=True),
        sa.Column("country", sa.String(2), nullable=True),
        sa.Column("tax_id", sa.String(64), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade():
    op.drop_table("billing_details")
    op.drop_index("ix_payments_created", table_name="payments")
    op.drop_table("invoice_counters")
    drop_append_only_trigger("invoices")
    op.drop_table("invoices")
