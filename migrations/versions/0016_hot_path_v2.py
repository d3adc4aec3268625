"""hot path v2: gw_open_call() with the key's spend limit, raising on a refusal; usage
rollups from the call log

1. ``gw_open_call`` (PostgreSQL only; replaces migration 0013's, which gains the
   ``p_spend_key`` argument and loses the usage upsert). It runs as ONE autocommit
   statement (``uow.one_statement``), so a refusal must leave nothing behind: it RAISEs
   (SQLSTATE ``GW402`` insufficient funds, ``GWKSL`` key spend limit) and PostgreSQL
   undoes the statement — reserved Idempotency-Key and spend counter included — with no
   ROLLBACK round trip. Order: synchronous_commit off (docs/performance.md), the
   Idempotency-Key, the key's spend-limit reserve (the conditional upsert of
   ``spend.reserve``), the conditional debits and the posting, the ``pending`` call.
2. ``usage_rollup_state``: one row, ``rolled_through`` = first hour NOT yet rolled into
   ``usage_hourly`` (``billing.usage.roll``). Hours before it come from ``usage_hourly``,
   later ones from the call log (``module_calls``, ``chat_completions``). On a populated
   database the counters of the current hour (and of any hour with a call still
   ``pending``) are deleted and the mark set there: the call log has them all.
   Downgrade writes the unrolled tail back into ``usage_hourly`` and restores 0013's
   function.
3. indexes on ``chat_completions.settled_at`` and ``module_calls.created_at`` (the rollup
   job reads the call log by time across accounts).

Revision ID: hot_path_v2
Revises: alert_status
Create Date: 2026-12-02 10:00:00.000000
"""
import importlib.util
import os
from datetime import datetime, timezone

from alembic import op
import sqlalchemy as sa

from app.models.base import UTCDateTime

revision = "hot_path_v2"
down_revision = "alert_status"
branch_labels = None
depends_on = None

OLD_SIGNATURE = ("varchar, varchar, integer, varchar, varchar, varchar, bigint, boolean, varchar, "
                 "varchar, varchar, timestamptz, timestamptz, timestamptz, varchar[], bigint[]")
NEW_SIGNATURE = OLD_SIGNATURE + ", varchar"

_T = sa.Column
_CALLS = sa.table("module_calls", _T("account_id", sa.String), _T("module_slug", sa.String),
                  _T("mode", sa.String), _T("status", sa.String), _T("price_micros", sa.BigInteger),
                  _T("created_at", UTCDateTime()))
_CHAT = sa.table("chat_completions", _T("account_id", sa.String), _T("model", sa.String),
                 _T("requested_model", sa.String), _T("mode", sa.String), _T("status", sa.String),
                 _T("error", sa.String), _T("cost_micros", sa.BigInteger), _T("settled_at", UTCDateTime()),
                 _T("created_at", UTCDateTime()))

OPEN_CALL = r"""
CREATE OR REPLACE FUNCTION gw_open_call(
    p_call_id varchar, p_account_id varchar, p_module_id integer, p_slug varchar,
    p_action varchar, p_mode varchar, p_price bigint, p_charged boolean,
    p_owner_agent_id varchar, p_idem_key varchar, p_req_hash varchar,
    p_now timestamptz, p_deadline timestamptz, p_idem_expires timestamptz,
    p_codes varchar[], p_amounts bigint[], p_spend_key varchar)
RETURNS TABLE (outcome text, idem_hash varchar, idem_status varchar, idem_body text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_txn bigint;
    v_n integer;
    v_limit bigint;
    v_period varchar;
    v_start timestamptz;
    v_spend_key varchar;
    v_utc timestamp := p_now AT TIME ZONE 'UTC';
    i integer;
BEGIN
    -- 1. the finalize commit (durable) flushes this transaction's WAL before any answer
    PERFORM set_config('synchronous_commit', 'off', true);

    -- 2. the Idempotency-Key: new, or replacing an expired record; else hand it back
    IF p_idem_key IS NOT NULL THEN
        INSERT INTO idempotency_records AS r
               (account_id, key, request_hash, call_id, status, created_at, expires_at)
        VALUES (p_account_id, p_idem_key, p_req_hash, p_call_id, 'in_flight', p_now, p_idem_expires)
        ON CONFLICT (account_id, key) DO UPDATE
           SET request_hash = EXCLUDED.request_hash, call_id = EXCLUDED.call_id,
               status = 'in_flight', response_body = NULL,
               created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
         WHERE r.expires_at <= p_now;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN
            RETURN QUERY SELECT 'existing'::text, r.request_hash, r.status, r.response_body
                           FROM idempotency_records r
                          WHERE r.account_id = p_account_id AND r.key = p_idem_key;
            RETURN;
        END IF;
    END IF;

    IF p_charged THEN
        -- 3. the key's spend limit (app/services/accounts/spend.py: same periods, same
        --    conditional upsert), before any debit; a refusal undoes the whole statement
        IF p_spend_key IS NOT NULL AND p_price > 0 THEN
            SELECT k.spend_limit_micros, k.spend_limit_period INTO v_limit, v_period
              FROM api_keys k WHERE k.id = p_spend_key;
            IF v_limit IS NOT NULL AND v_period IS NOT NULL THEN
                v_start := CASE v_period
                    WHEN 'day' THEN date_trunc('day', v_utc) AT TIME ZONE 'UTC'
                    WHEN 'week' THEN date_trunc('week', v_utc) AT TIME ZONE 'UTC'
                    WHEN 'month' THEN date_trunc('month', v_utc) AT TIME ZONE 'UTC'
                    ELSE timestamptz '1970-01-01 00:00:00+00' END;
                v_n := 0;
                IF p_price <= v_limit THEN
                    INSERT INTO key_spend AS s (key_id, period_start, spent_micros)
                    VALUES (p_spend_key, v_start, p_price)
                    ON CONFLICT (key_id, period_start) DO UPDATE
                       SET spent_micros = s.spent_micros + EXCLUDED.spent_micros
                     WHERE s.spent_micros + EXCLUDED.spent_micros <= v_limit;
                    GET DIAGNOSTICS v_n = ROW_COUNT;
                END IF;
                IF v_n = 0 THEN
                    RAISE EXCEPTION 'key spend limit' USING ERRCODE = 'GWKSL';
                END IF;
                v_spend_key := p_spend_key;
            END IF;
        END IF;

        -- 4. the posting: debits first (conditional, never below zero), then the entries
        FOR i IN 1 .. array_length(p_codes, 1) LOOP
            IF p_codes[i] LIKE 'acct:%' THEN
                UPDATE accounts SET balance_micros = balance_micros + p_amounts[i]
                 WHERE id = substr(p_codes[i], 6)
                   AND balance_micros + p_amounts[i] >= 0;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'insufficient funds' USING ERRCODE = 'GW402';
                END IF;
            END IF;
        END LOOP;
        INSERT INTO ledger_transactions (kind, ref, account_id, meta, created_at)
        VALUES ('module_call', 'call:' || p_call_id, p_account_id, NULL, p_now)
        RETURNING id INTO v_txn;
        INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at)
        SELECT v_txn, leg.code, leg.amount, p_now
          FROM unnest(p_codes, p_amounts) AS leg(code, amount);
    END IF;

    -- 5. the pending call (the sweep refunds it after p_deadline if nobody finalizes it)
    INSERT INTO module_calls (id, account_id, module_id, module_slug, action, mode, status,
                              price_micros, charged, owner_agent_id, idempotency_key,
                              spend_key_id, created_at, deadline_at)
    VALUES (p_call_id, p_account_id, p_module_id, p_slug, p_action, p_mode, 'pending',
            p_price, p_charged, p_owner_agent_id, p_idem_key, v_spend_key, p_now, p_deadline);

    RETURN QUERY SELECT 'opened'::text, NULL::varchar, NULL::varchar, NULL::text;
END
$fn$;
"""


def _v0013():
    path = os.path.join(os.path.dirname(__file__), "0013_hot_path_open_call_function.py")
    spec = importlib.util.spec_from_file_location("_m0013", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ts(name, value):
    return sa.bindparam(name, value, type_=UTCDateTime())


def upgrade():
    bind = op.get_bind()
    op.create_table(
        "usage_rollup_state",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("rolled_through", UTCDateTime(), nullable=False))
    op.create_index("ix_chat_completions_settled_at", "chat_completions", ["settled_at"])
    op.create_index("ix_module_calls_created_at", "module_calls", ["created_at"])
    # The mark: the current hour, or the hour of the oldest call still pending / the oldest
    # completion still held. The old counters put a completion in the hour it settled, the
    # new reads in the hour it was created: lower the mark until every completion settled
    # at or after it was also created at or after it (its counters are deleted below and
    # the call log has it), so none is lost or counted twice.
    opens = [bind.execute(sa.select(sa.func.min(col)).where(cond)).scalar()
             for col, cond in ((_CALLS.c.created_at, _CALLS.c.status == "pending"),
                               (_CHAT.c.created_at, _CHAT.c.status == "held"))]
    mark = _hour(min([datetime.now(timezone.utc), *(t for t in opens if t is not None)]))
    while True:
        earliest = bind.execute(sa.select(sa.func.min(_CHAT.c.created_at))
                                .where(_CHAT.c.settled_at >= mark)).scalar()
        if earliest is None or _hour(earliest) >= mark:
            break
        mark = _hour(earliest)
    op.execute(sa.text("DELETE FROM usage_hourly WHERE hour >= :m").bindparams(_ts("m", mark)))
    op.execute(sa.text("INSERT INTO usage_rollup_state (id, rolled_through) VALUES (1, :m)")
               .bindparams(_ts("m", mark)))
    if bind.dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS gw_open_call({OLD_SIGNATURE})")
        op.execute(OPEN_CALL)


def downgrade():
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS gw_open_call({NEW_SIGNATURE})")
        op.execute(_v0013().OPEN_CALL)
    mark = bind.execute(sa.text("SELECT rolled_through FROM usage_rollup_state WHERE id = 1")
                        .columns(rolled_through=UTCDateTime())).scalar()
    if mark is not None:  # the unrolled tail back into the counters the old code updates
        sums: dict = {}
        refunded = _CALLS.c.status == "refunded"
        calls = sa.select(_CALLS.c.account_id, _CALLS.c.module_slug, _CALLS.c.mode, _CALLS.c.created_at,
                          refunded, _CALLS.c.price_micros).where(_CALLS.c.created_at >= mark)
        for acct, product, mode, at, err, price in bind.execute(calls):
            _add(sums, (acct, product, mode, _hour(at)), 1 if err else 0, 0 if err else price)
        chat = sa.select(_CHAT.c.account_id, _CHAT.c.model, _CHAT.c.requested_model, _CHAT.c.mode,
                         _CHAT.c.created_at, _CHAT.c.status, _CHAT.c.error, _CHAT.c.cost_micros).where(
            _CHAT.c.created_at >= mark, _CHAT.c.status.in_(("settled", "released", "sandbox")))
        for acct, model, requested, mode, at, status, error, cost in bind.execute(chat):
            released = status == "released"
            _add(sums, (acct, "chat:" + (model or requested), mode, _hour(at)),
                 1 if released or error else 0, 0 if released else cost)
        for (acct, product, mode, hour), (n, errors, spend) in sums.items():
            bind.execute(sa.text(
                "INSERT INTO usage_hourly (account_id, product, mode, hour, calls, errors, spend_micros) "
                "VALUES (:a, :p, :mo, :h, :c, :e, :s)").bindparams(_ts("h", hour)),
                {"a": acct, "p": product, "mo": mode, "c": n, "e": errors, "s": spend})
    op.drop_index("ix_module_calls_created_at", table_name="module_calls")
    op.drop_index("ix_chat_completions_settled_at", table_name="chat_completions")
    op.drop_table("usage_rollup_state")


def _add(sums, key, error, spend):
    n, e, s = sums.get(key, (0, 0, 0))
    sums[key] = (n + 1, e + error, s + int(spend))


def _hour(ts):
    return ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
