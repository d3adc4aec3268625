"""The rate counters' PostgreSQL store (app/services/platform/ratecount.py)."""
from __future__ import annotations

from sqlalchemy import BigInteger, Text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db


class RateWindow(db.Model):
    """One rate counter (a plan's limit of an account, a key's rpm or tpm, a per-IP or
    per-mailbox throttle) when there is no Redis: PostgreSQL is then the store every worker
    and node shares. ``win``: its fixed windows, ``[start1, count1, start2, count2, …]``
    (epoch seconds, aligned like the Redis keys), then the hits of the last grant; moved to
    the new windows by the conditional upsert that counts (``gw_rate_hit``). ``until``: when
    its longest window ends; the rate-windows-purge job deletes the rows past it. UNLOGGED
    (migration rate_windows): counters need no WAL; a crash forgets the current windows."""

    __tablename__ = "rate_windows"
    __table_args__ = ({"prefixes": ["UNLOGGED"], "postgresql_with": {"fillfactor": 50}},)

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    win: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    until: Mapped[int] = mapped_column(BigInteger)
