"""Product analytics (SPEC endpoints 27–30): cheap ingestion, the ordered funnel,
recent events and active sessions."""
from __future__ import annotations

from datetime import datetime, timedelta

import orjson
from flask import current_app
from sqlalchemy import and_, delete, func, select

from app.errors import Unprocessable
from app.extensions import db
from app.services.platform.uow import in_unit_of_work, run_statement, transactional
from app.models import TrackEvent
from app.models.base import utcnow

FUNNEL_WINDOW = timedelta(days=7)
SESSION_WINDOW = timedelta(hours=1)
RECENT_LIMIT = 200
SESSIONS_LIMIT = 500
PROPS_MAX_BYTES = 4096  # ``props`` serialised as compact JSON
PROPS_TOO_LARGE = f"props: must serialise to at most {PROPS_MAX_BYTES:,} bytes of compact JSON."

# One autocommit INSERT (no BEGIN/COMMIT round trips) on a connection of the app's pool.
# With ``TRACK_ASYNC_COMMIT`` (default on) the same statement sets ``synchronous_commit``
# off for its own transaction only (``set_config(…, true)``: nothing outlives the
# statement, so it holds behind PgBouncer in transaction mode too): the INSERT returns
# without waiting for the WAL flush (about 10x faster under load); a crash of the database
# server can lose the last fraction of a second of analytics events — never anything
# else, since no other statement has the setting.
_COLUMNS = ("INSERT INTO track_events (event, session_id, props, account_id, created_at) "
            "SELECT %(event)s::varchar, %(session_id)s::varchar, %(props)s::jsonb, %(account_id)s::varchar, "
            "%(created_at)s::timestamptz")
_INSERT = _COLUMNS
_INSERT_ASYNC = _COLUMNS + " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"


def record(event: str, session_id: str | None, props: dict | None,
           account_id: str | None = None) -> None:
    """Store one event (input is validated by the schema; ``props`` over
    ``PROPS_MAX_BYTES`` serialised: 422, a rule the document cannot state): a single autocommit INSERT
    (``uow.run_statement``: one attempt, an event is not worth a retry that could store
    it twice). Its own connection, so never inside a unit of work (docs/transactions.md)."""
    if in_unit_of_work():
        raise RuntimeError("tracking.record writes on its own connection: call it outside a unit of work")
    raw = orjson.dumps(props) if props is not None else None
    if raw is not None and len(raw) > PROPS_MAX_BYTES:
        raise Unprocessable(PROPS_TOO_LARGE, param="props")
    params = {"event": event, "session_id": session_id, "props": raw.decode() if raw is not None else None,
              "account_id": account_id, "created_at": utcnow()}
    run_statement(_INSERT_ASYNC if current_app.config.get("TRACK_ASYNC_COMMIT", True) else _INSERT, params)


def funnel_steps() -> list[str]:
    """The ordered funnel steps from ``FUNNEL_STEPS`` (comma-separated event names)."""
    raw = current_app.config["FUNNEL_STEPS"]
    steps = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
    return [s.strip() for s in steps if s.strip()]


def funnel(account_id: str | None, *, steps: list[str] | None = None,
           now: datetime | None = None) -> dict:
    """Sessions reaching each step in order over the last 7 days.

    A session counts for step N when it has events for steps 1..N at non-decreasing
    times (the earliest step-1 event, then the earliest step-2 event at or after it, …).
    ``account_id`` restricts to events attributed to that account; None is global.
    Events without a ``session_id`` are not part of any funnel. One SQL statement: a
    chain of CTEs, one per step, each joining the previous step's sessions.
    """
    steps = steps or funnel_steps()
    now = now or utcnow()
    since = now - FUNNEL_WINDOW
    e = TrackEvent.__table__

    def base(step: str):
        cond = [e.c.event == step, e.c.created_at >= since, e.c.created_at <= now,
                e.c.session_id.is_not(None)]
        if account_id is not None:
            cond.append(e.c.account_id == account_id)
        return cond

    ctes = []
    for i, step in enumerate(steps):
        if i == 0:
            q = select(e.c.session_id.label("sid"), func.min(e.c.created_at).label("t")) \
                .where(*base(step)).group_by(e.c.session_id)
        else:
            prev = ctes[-1]
            q = select(e.c.session_id.label("sid"), func.min(e.c.created_at).label("t")) \
                .join(prev, and_(prev.c.sid == e.c.session_id, e.c.created_at >= prev.c.t)) \
                .where(*base(step)).group_by(e.c.session_id)
        ctes.append(q.cte(f"step{i}"))
    counts: list[int] = []
    if ctes:
        cols = [select(func.count()).select_from(c).scalar_subquery().label(f"c{i}")
                for i, c in enumerate(ctes)]
        row = db.session.execute(select(*cols)).one()
        counts = [int(v or 0) for v in row]
    out = []
    first = counts[0] if counts else 0
    for i, (step, n) in enumerate(zip(steps, counts)):
        prev = counts[i - 1] if i else n
        out.append({
            "step": i + 1,
            "event": step,
            "sessions": n,
            "conversion_from_previous": round(n / prev, 4) if prev else 0.0,
            "conversion_from_first": round(n / first, 4) if first else 0.0,
        })
    return {"scope": "account" if account_id is not None else "global",
            "window_start": since, "window_end": now, "steps": out}


def recent(limit: int = RECENT_LIMIT) -> list:
    """The last ``limit`` events (all accounts), newest first."""
    e = TrackEvent.__table__
    rows = db.session.execute(select(e).order_by(e.c.created_at.desc(), e.c.id.desc())
                              .limit(limit)).all()
    return list(rows)


def active_sessions(now: datetime | None = None, limit: int = SESSIONS_LIMIT) -> list[dict]:
    """Sessions with an event in the last hour: first/last seen and event count over the
    session's events of the last 7 days; most recently active first, at most ``limit``."""
    now = now or utcnow()
    e = TrackEvent.__table__
    active = select(e.c.session_id).where(e.c.created_at >= now - SESSION_WINDOW,
                                          e.c.session_id.is_not(None)).distinct()
    last_seen = func.max(e.c.created_at)
    q = (select(e.c.session_id, func.min(e.c.created_at), last_seen, func.count())
         .where(e.c.session_id.in_(active), e.c.created_at >= now - FUNNEL_WINDOW)
         .group_by(e.c.session_id).order_by(last_seen.desc()).limit(limit))
    return [{"session_id": sid, "first_seen": first, "last_seen": last, "events": int(n)}
            for sid, first, last, n in db.session.execute(q).all()]


@transactional
def prune(now: datetime | None = None) -> int:
    """Delete events older than ``TRACK_RETENTION_DAYS``; returns how many."""
    now = now or utcnow()
    cutoff = now - timedelta(days=int(current_app.config["TRACK_RETENTION_DAYS"]))
    res = db.session.execute(delete(TrackEvent).where(TrackEvent.created_at < cutoff)
                             .execution_options(synchronize_session=False))
    return res.rowcount or 0


__all__ = ["record", "funnel", "funnel_steps", "recent", "active_sessions", "prune"]
