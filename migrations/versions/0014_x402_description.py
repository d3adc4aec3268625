"""x402 description: the requirement a payment was presented for, whole

``x402_authorizations.description``: the description of the requirement the 402 offered
(x402 v1 requirements carry it, beside the resource URL and price kept since 0024 of the
old chain). Reconciliation sends the facilitator the same requirement again, so an
idempotent facilitator answers the settlement it already made; before this revision every
requirement said "Module call" (a chat completion's and each module's own description were
lost), which NULL still means.

Revision ID: x402_description
Revises: credit_notes
"""
import sqlalchemy as sa
from alembic import op

revision = "x402_description"
down_revision = "credit_notes"
branch_labels = None
depends_on = None

# NULL: an authorization reserved before this revision, whose requirement said "Module call"
DESCRIPTION = sa.Column("description", sa.String(300), nullable=True)


def upgrade():
    op.add_column("x402_authorizations", DESCRIPTION)


def downgrade():
    op.drop_column("x402_authorizations", "description")
