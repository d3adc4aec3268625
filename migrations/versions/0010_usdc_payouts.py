"""usdc payouts: the chain transaction of a USDC payout attempt on its payout row

* ``payouts.tx_from`` / ``tx_nonce`` / ``tx_hash`` / ``tx_raw``: the payout wallet's
  address, the nonce, the hash and the signed raw transaction of the attempt being sent
  (a USDC ``transfer``), written with the ``sending`` claim, before the chain is asked: a
  recovery sends the same signed transaction again and finds it by hash; it never signs a
  second transfer while the first may still land.
* ``uq_payouts_tx_nonce``: no two payouts' current attempts share a nonce of one wallet on
  one chain; ``tx_hash`` unique.

Revision ID: usdc_payouts
Revises: rate_windows
"""
import sqlalchemy as sa
from alembic import op

revision = "usdc_payouts"
down_revision = "rate_windows"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column("payouts", sa.Column("tx_from", sa.String(42), nullable=True))
    op.add_column("payouts", sa.Column("tx_nonce", sa.BigInteger(), nullable=True))
    op.add_column("payouts", sa.Column("tx_hash", sa.String(66), nullable=True))
    op.add_column("payouts", sa.Column("tx_raw", sa.Text(), nullable=True))
    op.create_index("uq_payouts_tx_hash", "payouts", ["tx_hash"], unique=True,
                    postgresql_where=sa.text("tx_hash IS NOT NULL"))
    op.create_index("uq_payouts_tx_nonce", "payouts", ["chain", "tx_from", "tx_nonce"], unique=True,
                    postgresql_where=sa.text("tx_nonce IS NOT NULL"))


def downgrade():
    op.drop_index("uq_payouts_tx_nonce", table_name="payouts")
    op.drop_index("uq_payouts_tx_hash", table_name="payouts")
    for col in ("tx_raw", "tx_hash", "tx_nonce", "tx_from"):
        op.drop_column("payouts", col)
