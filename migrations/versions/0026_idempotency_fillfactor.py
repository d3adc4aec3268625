"""idempotency_records: fillfactor 40, so the finalize's update stays on the row's page

A metered call with an Idempotency-Key inserts its record at open (``in_flight``, ~200
bytes) and the finalize (``gw_finalize_calls``) rewrites it with the stored response
(``done`` + ``response_body``: ~730 bytes for the bench's echo module). None of the
columns it changes is indexed, so the update can be HOT — a new version on the same
page, no new entries in the three indexes (primary key, ``(account_id, key)``,
``expires_at``) — but only when that page has room. With the default fillfactor 100 the
inserts of the calls opened in between have usually filled it: on the bench 30–42 % of
these updates were not HOT (three index insertions each, and the old version's entries
left for vacuum).

Fillfactor 40 keeps 60 % of each new page for those updates. Measured on the bench stack
(08:10Z, metered c=16, three alternating pairs of 10 s runs, the setting switched between
them): HOT updates 58–70 % → 96–97 %, PostgreSQL CPU per call 0.41–0.49 → 0.40–0.42 ms,
1,038–1,294 → 1,301–1,365 calls/s. It costs little space: a record ends 3.6 times the size
it was inserted at, so a page of finished records holds about as many at either setting.

``ALTER TABLE … SET (fillfactor)`` takes a SHARE UPDATE EXCLUSIVE lock (reads and writes go
on) and applies to pages filled from then on; existing pages are left as they are
(records expire and are purged within a day). PostgreSQL only; SQLite has no fillfactor.
Downgrade restores 100.

Revision ID: idempotency_fillfactor
Revises: drop_unread_indexes
Create Date: 2026-11-24 08:20:00.000000
"""
from alembic import op

revision = "idempotency_fillfactor"
down_revision = "drop_unread_indexes"
branch_labels = None
depends_on = None

FILLFACTOR = 40


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE idempotency_records SET (fillfactor = {FILLFACTOR})")


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE idempotency_records RESET (fillfactor)")
