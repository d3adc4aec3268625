"""What more than one migration does, written once: the ledger's append-only trigger on a
table, and the ``key_rate_windows`` table (created by ``byok_key_controls``, created again
by ``rate_windows``'s downgrade).

A helper here is part of every migration that calls it: change one only in a way that
leaves what those migrations create the same (compare ``pg_dump --schema-only`` of a
database upgraded before and after)."""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime


def create_append_only_trigger(table: str) -> None:
    """``gw_<table>_append_only``: the ledger's ``gw_ledger_append_only`` refuses any UPDATE
    or DELETE of ``table``."""
    op.execute(f"CREATE TRIGGER gw_{table}_append_only BEFORE UPDATE OR DELETE ON {table} "
               "FOR EACH STATEMENT EXECUTE FUNCTION gw_ledger_append_only()")


def drop_append_only_trigger(table: str) -> None:
    op.execute(f"DROP TRIGGER IF EXISTS gw_{table}_append_only ON {table}")


def create_key_rate_windows() -> None:
    """The per-key rate windows of ``byok_key_controls`` (replaced by ``rate_windows``)."""
    op.create_table(
        "key_rate_windows",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("window_start", UTCDateTime(), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("used >= 0", name="used_nonnegative"),
    )
