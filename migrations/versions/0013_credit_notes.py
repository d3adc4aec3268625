"""credit notes: a refunded payment's invoice is credited by a numbered credit note

* ``invoices.credits_invoice_id``: set on a credit note (``kind = 'credit_note'``, series
  ``cn_live`` / ``cn_test``, numbered ``CN-000001`` gap-free per seller like invoices) to the
  invoice it credits; indexed, an invoice's credit notes are read with it.
* ``uq_invoices_payment`` becomes unique per payment among ``kind = 'payment'`` invoices:
  a credit note names the payment it refunds too.

Revision ID: credit_notes
Revises: subscription_mailbox
"""
import sqlalchemy as sa
from alembic import op

from migrations.helpers import create_append_only_trigger, drop_append_only_trigger

revision = "credit_notes"
down_revision = "subscription_mailbox"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column("invoices", sa.Column("credits_invoice_id", sa.String(32), sa.ForeignKey("invoices.id"),
                                        nullable=True))
    op.create_index("ix_invoices_credits", "invoices", ["credits_invoice_id"],
                    postgresql_where=sa.text("credits_invoice_id IS NOT NULL"))
    op.drop_index("uq_invoices_payment", table_name="invoices")
    op.create_index("uq_invoices_payment", "invoices", ["payment_id"], unique=True,
                    postgresql_where=sa.text("payment_id IS NOT NULL AND kind = 'payment'"))


def downgrade():
    drop_append_only_trigger("invoices")  # the credit notes go with their column
    op.execute("DELETE FROM invoices WHERE kind = 'credit_note'")
    create_append_only_trigger("invoices")
    op.execute("DELETE FROM invoice_counters WHERE series LIKE 'cn\\_%'")
    op.drop_index("uq_invoices_payment", table_name="invoices")
    op.create_index("uq_invoices_payment", "invoices", ["payment_id"], unique=True,
                    postgresql_where=sa.text("payment_id IS NOT NULL"))
    op.drop_index("ix_invoices_credits", table_name="invoices")
    op.drop_column("invoices", "credits_invoice_id")
