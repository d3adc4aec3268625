"""Usage from the call logs: the live tail, and the job that rolls it up.

Nothing on a metered path writes usage: a module call's usage is its ``module_calls``
row, a chat completion's its ``chat_completions`` row. ``usage_hourly`` holds the
rollups of hours that are *final* (``usage_rollup_state.rolled_through`` is the first
hour not final-rolled yet) and, for the hours from there on, the calls up to
``tail_through`` (a whole minute, or NULL: nothing after ``rolled_through``), added
minute by minute. ``usage_daily`` holds the sums of the days whose every hour is
final-rolled, up to ``days_rolled_through`` (the day of ``rolled_through``). A reader
(``billing.usage``, alert metrics) sums, in one query (``usage_rows``), the whole rolled
days of its range from ``usage_daily``, the other hours from ``usage_hourly`` and the
call log from the *tail mark* on (``tail_through``, else ``rolled_through``): the
calls of the last minute or two, not of the last hour.

How a call counts (the same as the counters the charging transaction used to keep):

* module call, in the hour of ``created_at``: 1 call; ``refunded`` → 1 error and no
  spend, otherwise ``price_micros`` of spend (``pending`` counts as charged);
* chat completion, in the hour of ``created_at`` (once ``settled``, ``released`` or
  ``sandbox``; a ``held`` one is not counted yet), product ``chat:<model>``: 1 call;
  ``released`` → 1 error and no spend; otherwise ``cost_micros``, and an error when its
  ``error`` is set. By ``created_at``, like module calls, because both call logs are
  partitioned by it (PostgreSQL): a read of a time range touches only its months.

An hour is final when it ended ``USAGE_ROLL_MARGIN_SECONDS`` ago (a transaction that
took its timestamp before the hour ended has committed), no module call created in it
is still ``pending`` (a refund would change it; the sweep resolves every pending call
after its deadline) and no chat completion created in it is still ``held`` (its settle
or release would change it; the stale-hold sweep resolves every hold whose stream
stopped). ``roll()`` is idempotent: it rewrites the rows of the final hours it rolls
(delete + insert from the log), then those of the days that became fully rolled (delete
+ insert from their hours), and moves both marks, in one unit of work.

The tail roll (same run, same unit of work, once the final hours are caught up) adds
the calls of the whole minutes from the tail mark to the first minute that is not
*settled* to their hours' rows (an upsert adding calls, errors and spend) and moves
``tail_through`` there. A minute is settled when it ended ``USAGE_TAIL_MARGIN_SECONDS``
ago (60; 0 turns the tail roll off) and no call created in it is still pending and no
completion still held, as for a final hour. What the shorter margin can cost: a call
whose transaction took its ``created_at`` more than the margin before it committed is
not seen by the tail roll that passed its minute, so readers miss it until its hour's
final roll (which rewrites the whole hour from the log with the longer margin) — a
late, never a double or lost count. Every metered path takes ``created_at`` in the
transaction that commits it within milliseconds.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from flask import current_app
from sqlalchemy import bindparam, case, delete, func, insert, literal, literal_column, or_, select, union_all
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import BindParameter

from app.extensions import db
from app.models import ChatCompletion, ModuleCall, UsageDaily, UsageHourly, UsageRollupState
from app.models.base import UTCDateTime, utcnow
from app.models.calls import IS_PENDING
from app.services.platform.uow import unit_of_work

_CALLS = ModuleCall.__table__
_CHAT = ChatCompletion.__table__
_USAGE = UsageHourly.__table__
_DAILY = UsageDaily.__table__
_STATE = UsageRollupState.__table__
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
COLUMNS = ("account_id", "product", "mode", "ts", "calls", "errors", "spend_micros")


def hour_of(ts: datetime) -> datetime:
    return ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)


def day_of(ts: datetime) -> datetime:
    return hour_of(ts).replace(hour=0)


def minute_of(ts: datetime) -> datetime:
    return ts.astimezone(timezone.utc).replace(second=0, microsecond=0)


def _mark(column=_STATE.c.rolled_through):
    """A rollup mark as a scalar subquery (the epoch when there is no state row or value)."""
    return func.coalesce(select(column).where(_STATE.c.id == 1).scalar_subquery(),
                         literal(EPOCH, UTCDateTime()))


def _tail_mark():
    """Where the call-log part of a read starts: ``tail_through``, else ``rolled_through``."""
    return _mark(func.coalesce(_STATE.c.tail_through, _STATE.c.rolled_through))


def _where(col_account, col_mode, col_ts, start, end, accounts, modes):
    cond = [col_ts >= start, col_ts < end]
    if accounts is not None:
        one = isinstance(accounts, (str, BindParameter))
        cond.append(col_account == accounts if one else col_account.in_(accounts))
    if modes is not None:
        cond.append(col_mode.in_(modes))
    return cond


def call_log_rows(start: datetime, end: datetime, accounts=None, modes=None, *, since_mark: bool = True,
                  actor=None):
    """The per-call usage rows (``COLUMNS``) of module calls and chat completions in
    [start, end); with ``since_mark`` only those at or after the tail mark (the calls no
    roll has counted yet); with ``actor`` only the calls of that API key (the rollups have
    no key dimension: ``key_rows``)."""
    refunded = _CALLS.c.status == "refunded"
    calls = select(
        _CALLS.c.account_id, _CALLS.c.module_slug.label("product"), _CALLS.c.mode,
        _CALLS.c.created_at.label("ts"), literal(1).label("calls"),
        case((refunded, 1), else_=0).label("errors"),
        case((refunded, 0), else_=_CALLS.c.price_micros).label("spend_micros"),
    ).where(*_where(_CALLS.c.account_id, _CALLS.c.mode, _CALLS.c.created_at, start, end, accounts, modes))
    released = _CHAT.c.status == "released"
    chat = select(
        _CHAT.c.account_id,
        (literal("chat:") + func.coalesce(_CHAT.c.model, _CHAT.c.requested_model)).label("product"),
        _CHAT.c.mode, _CHAT.c.created_at.label("ts"), literal(1).label("calls"),
        case((or_(released, _CHAT.c.error.is_not(None)), 1), else_=0).label("errors"),
        case((released, 0), else_=_CHAT.c.cost_micros).label("spend_micros"),
    ).where(_CHAT.c.status.in_(("settled", "released", "sandbox")),
            *_where(_CHAT.c.account_id, _CHAT.c.mode, _CHAT.c.created_at, start, end, accounts, modes))
    if since_mark:
        calls = calls.where(_CALLS.c.created_at >= _tail_mark())
        chat = chat.where(_CHAT.c.created_at >= _tail_mark())
    if actor is not None:
        calls, chat = calls.where(_CALLS.c.actor == actor), chat.where(_CHAT.c.actor == actor)
    return calls, chat


def key_rows(start, end, account, modes, key_id):
    """The usage rows (``COLUMNS``) of one API key's calls in [start, end), read from the call
    logs (one row per call, counted as the rollups count them): the filtered usage reads
    (``key_id``) of one account, which the hourly and daily rollups cannot answer."""
    return union_all(*call_log_rows(start, end, account, modes, since_mark=False, actor=key_id)).subquery("usage_rows")


def _hourly(lo, hi, accounts, modes, *cond):
    return select(_USAGE.c.account_id, _USAGE.c.product, _USAGE.c.mode, _USAGE.c.hour.label("ts"),
                  _USAGE.c.calls, _USAGE.c.errors, _USAGE.c.spend_micros).where(
        *_where(_USAGE.c.account_id, _USAGE.c.mode, _USAGE.c.hour, lo, hi, accounts, modes), *cond)


def _daily(lo, hi, accounts, modes, *cond):
    return select(_DAILY.c.account_id, _DAILY.c.product, _DAILY.c.mode, _DAILY.c.day.label("ts"),
                  _DAILY.c.calls, _DAILY.c.errors, _DAILY.c.spend_micros).where(
        *_where(_DAILY.c.account_id, _DAILY.c.mode, _DAILY.c.day, lo, hi, accounts, modes), *cond)


def usage_rows(start: datetime, end: datetime, accounts=None, modes=None, *, cuts=()):
    """A subquery of usage rows (``COLUMNS``) in [hour of start, end): rolled days of
    ``usage_daily`` (``ts`` = 00:00 UTC of the day), rolled hours of ``usage_hourly``
    (``ts`` = the hour) and the calls of the not-yet-rolled tail (one row per call).
    ``accounts``: one id, a list or a select; ``modes``: a tuple (None: every mode).

    A day comes from ``usage_daily`` only when it lies wholly inside [start, end), is
    rolled (before ``days_rolled_through``) and contains none of ``cuts`` except at its
    00:00; its hours come from ``usage_hourly`` otherwise. So ``ts >= c`` selects exactly
    the usage from ``c`` on for ``c`` = start, any hour of ``cuts`` and any 00:00: sum
    it, group it, filter it by such a ``ts``. One statement (the marks are subqueries).
    A range of whole days without cuts has the shape of ``whole_day_rows``."""
    start = hour_of(start)
    first, last = day_of(start), day_of(end)  # whole days: [first or first + 1 day, last)
    if first != start:
        first += DAY
    days_mark = _mark(_STATE.c.days_rolled_through)
    split = sorted({day_of(c) for c in (*cuts, end) if day_of(c) != c and first <= day_of(c) < last})
    # hours of days never read daily here: before the first whole day, the split days, end's day
    before = [(start, first)] if first < last else [(start, end)]
    for lo, hi in [(day, day + DAY) for day in split] + ([(last, end)] if first < last < end else []):
        if before[-1][1] == lo:
            before[-1] = (before[-1][0], hi)
        else:
            before.append((lo, hi))
    parts = [_hourly(lo, min(hi, end), accounts, modes, _USAGE.c.hour < days_mark)
             for lo, hi in before if lo < min(hi, end)]
    parts.append(_hourly(start, end, accounts, modes, _USAGE.c.hour >= days_mark))  # days not rolled daily yet
    if first < last:
        parts.append(_daily(first, last, accounts, modes, _DAILY.c.day < days_mark,
                            *([_DAILY.c.day.not_in(split)] if split else [])))
    return union_all(*parts, *call_log_rows(start, end, accounts, modes)).subquery("usage_rows")


def is_whole_days(start: datetime, end: datetime) -> bool:
    """True when [start, end) is whole UTC days (both at 00:00 UTC, start < end): the
    range ``whole_day_rows`` reads."""
    return start < end and day_of(start) == start and day_of(end) == end


def whole_day_rows():
    """``usage_rows(start, end, account, (mode,))`` for a range of whole UTC days
    (``is_whole_days``) of one account and one mode, with the values as bind parameters
    ``:start``, ``:end``, ``:account``, ``:mode`` — the same parts (``usage_daily`` before
    the days mark, ``usage_hourly`` from it, the call log from the rollup mark), built
    once: a caller that caches the statement around it skips building and compiling it
    per read (the usage endpoints: ``billing.usage``)."""
    start, end = bindparam("start", type_=UTCDateTime()), bindparam("end", type_=UTCDateTime())
    account, modes = bindparam("account"), (bindparam("mode"),)
    days_mark = _mark(_STATE.c.days_rolled_through)
    return union_all(_hourly(start, end, account, modes, _USAGE.c.hour >= days_mark),
                     _daily(start, end, account, modes, _DAILY.c.day < days_mark),
                     *call_log_rows(start, end, account, modes)).subquery("usage_rows")


def member_keys(org_id, member_id):
    """The ids of the organisation keys a member owns or owned (``api_keys.member_account_id``;
    revoked and rotated keys included: their calls stay the member's)."""
    from app.models import ApiKey

    keys = ApiKey.__table__
    return select(keys.c.id).where(keys.c.account_id == org_id, keys.c.member_account_id == member_id)


def member_rows(start, end, org_id, modes, member_id, key_id=None):
    """The per-call usage rows (``COLUMNS``) of one organisation in [start, end) made by one
    member's keys (``key_id``: only that one of them; none if it is not theirs): the call
    logs read by ``actor`` (the key that acted), since the rollups keep no actor. Cost: the
    organisation's calls of the range through the ``(account_id, created_at)`` indexes,
    filtered by actor (docs/teams.md, "Usage")."""
    from app.models import ApiKey

    keys = member_keys(org_id, member_id)
    if key_id is not None:
        keys = keys.where(ApiKey.__table__.c.id == key_id)
    calls, chat = call_log_rows(start, end, org_id, modes, since_mark=False)
    return union_all(calls.where(_CALLS.c.actor.in_(keys)),
                     chat.where(_CHAT.c.actor.in_(keys))).subquery("usage_rows")


def rolled_through() -> datetime:
    """The first hour not final-rolled into ``usage_hourly`` (the epoch when never run)."""
    return db.session.execute(select(_mark())).scalar_one()


def tail_through() -> datetime:
    """Where readers start reading the call log: the tail mark (the epoch when never run)."""
    return db.session.execute(select(_tail_mark())).scalar_one()


# The oldest call of each log that may still change (a pending module call, a held chat
# completion): the first live entry of an index on the open rows — the partial
# ix_module_calls_pending_created (migration 0023; ``IS_PENDING``), chat's (status, created_at).
OLDEST_OPEN = (select(func.min(_CALLS.c.created_at)).where(IS_PENDING),
               select(func.min(_CHAT.c.created_at)).where(_CHAT.c.status == literal_column("'held'")))


def _settled_before(now: datetime) -> tuple[datetime, datetime | None]:
    """(hours before this one are final, minutes before this one are settled — None when
    the tail roll is off); see the module docstring."""
    config = current_app.config
    margin = timedelta(seconds=float(config.get("USAGE_ROLL_MARGIN_SECONDS", 300)))
    tail_margin = float(config.get("USAGE_TAIL_MARGIN_SECONDS", 60))
    open_rows = [t for t in (db.session.execute(q).scalar() for q in OLDEST_OPEN) if t is not None]
    final = min([hour_of(now - margin), *(hour_of(t) for t in open_rows)])
    if tail_margin <= 0:
        return final, None
    return final, min([minute_of(now - timedelta(seconds=tail_margin)), *(minute_of(t) for t in open_rows)])


def _first_logged() -> datetime | None:
    firsts = [db.session.execute(select(func.min(col))).scalar()
              for col in (_CALLS.c.created_at, _CHAT.c.created_at)]
    firsts = [hour_of(t) for t in firsts if t is not None]
    return min(firsts) if firsts else None


def roll(now: datetime | None = None, *, max_hours: int = 48) -> int:
    """Roll the final hours after the mark (at most ``max_hours`` per run) into
    ``usage_hourly``, then the days that became fully rolled into ``usage_daily``; once
    the final hours are caught up, add the settled minutes after the tail mark to their
    hours' rows; move the marks. Returns how many hours it final-rolled. One unit of work;
    concurrent runs serialize on the state row. Idempotent."""
    now = now or utcnow()
    s = db.session
    with unit_of_work():
        state = s.execute(select(_STATE.c.rolled_through, _STATE.c.days_rolled_through, _STATE.c.tail_through)
                          .where(_STATE.c.id == 1).with_for_update()).first()
        mark, days_mark, tail = state if state is not None else (None, None, None)
        stored = (days_mark, tail)
        if mark is None:  # never run on this database (the migration sets it): start at the log
            mark = _first_logged()
            if mark is None:
                return 0
            s.execute(insert(_STATE).values(id=1, rolled_through=mark))
        final, settled = _settled_before(now)
        target = min(final, mark + max_hours * HOUR)
        hours = 0
        hour = mark
        while hour < target:
            _roll_hour(hour)  # rewrites the hour: the minutes added to it before are replaced
            hour += HOUR
            hours += 1
        tail = tail if tail is not None and tail > hour else hour
        if hour >= final and settled is not None and settled > tail:
            _add_minutes(tail, settled)
            tail = settled
        tail = tail if tail > hour else None
        if days_mark is None:  # no day rolled yet: from the first rolled hour on
            first = s.execute(select(func.min(_USAGE.c.hour))).scalar()
            days_mark = day_of(min(first, mark) if first is not None else mark)
        day = days_mark
        while day < day_of(hour):
            _roll_day(day)
            day += DAY
        if hours or (day, tail) != stored:
            s.execute(_STATE.update().where(_STATE.c.id == 1).values(
                rolled_through=hour, days_rolled_through=day, tail_through=tail))
    return hours


def _add_minutes(lo: datetime, hi: datetime) -> None:
    """Add the calls of [lo, hi) (whole minutes after the tail mark) to their hours' rows
    of ``usage_hourly``: one upsert per hour the range touches."""
    hour = hour_of(lo)
    while hour < hi:
        rows = union_all(*call_log_rows(max(lo, hour), min(hi, hour + HOUR), since_mark=False)).subquery()
        ins = pg_insert(_USAGE).from_select(
            ["account_id", "product", "mode", "hour", "calls", "errors", "spend_micros"], _sums(rows.c, hour))
        db.session.execute(ins.on_conflict_do_update(
            index_elements=["account_id", "product", "mode", "hour"],
            set_={"calls": _USAGE.c.calls + ins.excluded.calls, "errors": _USAGE.c.errors + ins.excluded.errors,
                  "spend_micros": _USAGE.c.spend_micros + ins.excluded.spend_micros}))
        hour += HOUR


def _roll_hour(hour: datetime) -> None:
    """Rewrite the rows of one hour from the call log (delete + insert … select)."""
    s = db.session
    s.execute(delete(_USAGE).where(_USAGE.c.hour == hour))
    rows = union_all(*call_log_rows(hour, hour + HOUR, since_mark=False)).subquery()
    _insert_sums(_USAGE, "hour", rows, rows.c, hour)


def _roll_day(day: datetime) -> None:
    """Rewrite the rows of one fully rolled day from its ``usage_hourly`` rows."""
    s = db.session
    s.execute(delete(_DAILY).where(_DAILY.c.day == day))
    rows = select(_USAGE).where(_USAGE.c.hour >= day, _USAGE.c.hour < day + DAY).subquery()
    _insert_sums(_DAILY, "day", rows, rows.c, day)


def _sums(c, ts: datetime):
    """The usage rows with columns ``c`` summed per account, product and mode, at ``ts``."""
    return select(c.account_id, c.product, c.mode, literal(ts, UTCDateTime()),
                  func.sum(c.calls), func.sum(c.errors), func.sum(c.spend_micros)
                  ).group_by(c.account_id, c.product, c.mode)


def _insert_sums(table, ts_column: str, rows, c, ts: datetime) -> None:
    """insert … select of ``rows`` summed per account, product and mode, at ``ts``."""
    db.session.execute(insert(table).from_select(
        ["account_id", "product", "mode", ts_column, "calls", "errors", "spend_micros"], _sums(c, ts)))


def member_totals(start, end, org_id, modes):
    """One statement: (member id, calls, errors, spend_micros) of each member whose
    organisation keys called in [start, end) — the call logs of ``org_id`` read by actor
    (as ``member_rows``, one pass for every member) joined to the keys' members (revoked
    and rotated keys included; former members too). Cost: the organisation's calls of the
    range through the ``(account_id, created_at)`` indexes."""
    from app.models import ApiKey

    keys = ApiKey.__table__
    calls, chat = call_log_rows(start, end, org_id, modes, since_mark=False)
    u = union_all(calls.add_columns(_CALLS.c.actor.label("actor")),
                  chat.add_columns(_CHAT.c.actor.label("actor"))).subquery("usage_rows")
    member = keys.c.member_account_id
    return (select(member, func.sum(u.c.calls), func.sum(u.c.errors), func.sum(u.c.spend_micros))
            .select_from(u.join(keys, keys.c.id == u.c.actor))
            .where(keys.c.account_id == org_id, member.is_not(None))
            .group_by(member).order_by(func.sum(u.c.spend_micros).desc(), member))
