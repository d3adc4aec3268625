"""billing: auto top-up, saved payment methods

* ``auto_topups``: an account's auto top-up rule per mode (threshold, amount, monthly cap,
  consecutive failures, disabled reason).
* ``auto_topup_runs``: one row per threshold crossing's top-up; at most one open (queued or
  processing) per account and mode (unique partial index).
* ``accounts.topup_below_micros`` / ``test_topup_below_micros``: the thresholds cached on
  the balance row (NULL: off) and the row trigger ``gw_accounts_autotopup`` whose WHEN
  clause compares them with the old and new balance, so only a crossing calls
  ``gw_autotopup_crossed`` (``app/services/billing/sql/``), which queues the run.
* ``saved_methods``: the payment methods an account saved with a processor (the billing
  profile names the default), filled with each profile's default method.

Revision ID: billing
Revises: byok_key_controls
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "billing"
down_revision = "byok_key_controls"
branch_labels = None
depends_on = None

_OPEN = sa.text("status IN ('queued', 'processing')")
_WHEN = ("(NEW.topup_below_micros IS NOT NULL AND NEW.balance_micros < NEW.topup_below_micros "
         "AND OLD.balance_micros >= NEW.topup_below_micros) "
         "OR (NEW.test_topup_below_micros IS NOT NULL AND NEW.test_balance_micros < NEW.test_topup_below_micros "
         "AND OLD.test_balance_micros >= NEW.test_topup_below_micros)")


def _account_table(name: str, *columns, times: tuple[str, ...] = ("created_at", "updated_at")) -> None:
    """A table of rows of one account: ``id``, ``account_id``, ``columns``, then ``times``."""
    op.create_table(name, sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
                    sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), nullable=False),
                    *columns, *(sa.Column(t, UTCDateTime(), nullable=False) for t in times))


def _cols(nullable: bool, **types) -> list[sa.Column]:
    return [sa.Column(name, type_, nullable=nullable) for name, type_ in types.items()]


def upgrade():
    op.add_column("accounts", sa.Column("topup_below_micros", sa.BigInteger(), nullable=True))
    op.add_column("accounts", sa.Column("test_topup_below_micros", sa.BigInteger(), nullable=True))
    _account_table("auto_topups",
                   *_cols(False, mode=sa.String(8), threshold_micros=sa.BigInteger(), amount_micros=sa.BigInteger(),
                          monthly_cap_micros=sa.BigInteger(), enabled=sa.Boolean(), failures=sa.Integer()),
                   sa.Column("disabled_reason", sa.String(300), nullable=True),
                   sa.UniqueConstraint("account_id", "mode", name="uq_auto_topups_account_mode"))
    _account_table("auto_topup_runs",
                   *_cols(False, mode=sa.String(8), status=sa.String(16)),
                   *_cols(True, reason=sa.String(300), balance_micros=sa.BigInteger(), amount_micros=sa.BigInteger(),
                          payment_id=sa.String(32)),
                   sa.Column("attempts", sa.Integer(), nullable=False),
                   sa.Column("due_at", UTCDateTime(), nullable=False),
                   sa.Column("lease_until", UTCDateTime(), nullable=True))
    op.create_index("uq_auto_topup_runs_open", "auto_topup_runs", ["account_id", "mode"], unique=True,
                    postgresql_where=_OPEN)
    op.create_index("ix_auto_topup_runs_due", "auto_topup_runs", ["due_at"], postgresql_where=_OPEN)
    op.create_index("ix_auto_topup_runs_account", "auto_topup_runs", ["account_id", "mode", "created_at"])
    _account_table("saved_methods",
                   *_cols(False, processor=sa.String(16), payment_method_id=sa.String(120),
                          payment_method_type=sa.String(32)),
                   *_cols(True, brand=sa.String(40), last4=sa.String(4)),
                   sa.UniqueConstraint("account_id", "processor", "payment_method_id", name="uq_saved_methods"),
                   times=("created_at",))
    # the default method each profile saved before this list existed
    op.execute("INSERT INTO saved_methods (account_id, processor, payment_method_id, payment_method_type, brand, "
               "last4, created_at) SELECT account_id, processor, payment_method_id, "
               "coalesce(payment_method_type, 'card'), brand, last4, updated_at FROM billing_profiles "
               "WHERE payment_method_id IS NOT NULL")
    from app import sqlfunctions

    sqlfunctions.install(op.get_bind(), ["gw_autotopup_crossed"])
    op.execute("CREATE TRIGGER gw_accounts_autotopup AFTER UPDATE OF balance_micros, test_balance_micros "
               f"ON accounts FOR EACH ROW WHEN ({_WHEN}) EXECUTE FUNCTION gw_autotopup_crossed()")


def downgrade():
    op.execute("DROP TRIGGER IF EXISTS gw_accounts_autotopup ON accounts")
    op.drop_table("saved_methods")
    op.drop_table("auto_topup_runs")
    op.drop_table("auto_topups")
    op.drop_column("accounts", "test_topup_below_micros")
    op.drop_column("accounts", "topup_below_micros")
