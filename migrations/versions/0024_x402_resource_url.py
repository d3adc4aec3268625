"""x402 authorizations: the resource the payment was presented for

Reconciliation settles a ``reserved`` authorization again when the facilitator never
answered ``/settle``. For x402 v1 the payment requirement carries the resource URL, and
reconciliation rebuilt it with ``BASE_URL`` instead of the call's URL
(``/v1/module/<slug>/call``): not the request that was settled, so a facilitator answered
``invalid_exact_evm_nonce_already_used`` and the authorization was released — the payer's
USDC had moved and nothing was credited. The URL is now stored at reservation
(``resource_url``, NULL for rows from before: they fall back to ``BASE_URL``).

Revision ID: x402_resource_url
Revises: pending_call_indexes
Create Date: 2026-11-24 00:30:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = "x402_resource_url"
down_revision = "pending_call_indexes"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("x402_authorizations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resource_url", sa.String(length=2000), nullable=True))


def downgrade():
    with op.batch_alter_table("x402_authorizations", schema=None) as batch_op:
        batch_op.drop_column("resource_url")
