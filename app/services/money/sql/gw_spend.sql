-- Per-key spend limits (issue 16 item 3): the period rule and the counters of key_spend,
-- written once. Callers: gw_open_calls, gw_chat_hold, gw_chat_settle, gw_refund_call,
-- gw_chat_release and Python's accounts.spend (refusal details, key edits).
--
-- A key with spend_limit_micros counts what it spends per spend_limit_period: day (UTC
-- midnight), week (ISO week, Monday 00:00 UTC), month (the 1st, 00:00 UTC) or total (one
-- period since 1970-01-01), in the key_spend row (key_id, period_start).

-- [start, end) of the period containing p_at (end NULL for total).
CREATE OR REPLACE FUNCTION gw_period_bounds(p_period varchar, p_at timestamptz,
                                            OUT period_from timestamptz, OUT period_to timestamptz)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT s, CASE p_period WHEN 'day' THEN s + interval '1 day'
                            WHEN 'week' THEN s + interval '7 days'
                            WHEN 'month' THEN ((s AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'
              END
      FROM (SELECT CASE p_period
                WHEN 'day' THEN date_trunc('day', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                WHEN 'week' THEN date_trunc('week', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                WHEN 'month' THEN date_trunc('month', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                ELSE timestamptz '1970-01-01 00:00:00+00' END AS s) AS b
$fn$;

-- Count p_micros against the key's limit for the period of p_now: ONE conditional upsert
-- (concurrent reserves serialize on the counter row). outcome: 'none' (no key, no limit,
-- nothing to count: nothing written), 'reserved' (counted in the period starting
-- reserved_from — keep it: the release goes back to THAT period, whatever the key's
-- period is by then), or 'refused' (nothing written).
CREATE OR REPLACE FUNCTION gw_spend_reserve(p_key varchar, p_micros bigint, p_now timestamptz,
                                            OUT outcome text, OUT reserved_from timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_limit bigint;
    v_period varchar;
    v_from timestamptz;
    v_n integer := 0;
BEGIN
    outcome := 'none';
    IF p_key IS NULL OR p_micros <= 0 THEN
        RETURN;
    END IF;
    SELECT k.spend_limit_micros, k.spend_limit_period INTO v_limit, v_period
      FROM api_keys k WHERE k.id = p_key;
    IF v_limit IS NULL OR v_period IS NULL THEN
        RETURN;
    END IF;
    v_from := (gw_period_bounds(v_period, p_now)).period_from;
    IF p_micros <= v_limit THEN
        INSERT INTO key_spend AS s (key_id, period_start, spent_micros)
        VALUES (p_key, v_from, p_micros)
        ON CONFLICT (key_id, period_start) DO UPDATE
           SET spent_micros = s.spent_micros + EXCLUDED.spent_micros
         WHERE s.spent_micros + EXCLUDED.spent_micros <= v_limit;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    IF v_n = 0 THEN
        outcome := 'refused';
    ELSE
        outcome := 'reserved';
        reserved_from := v_from;
    END IF;
END
$fn$;

-- Give p_micros back to the counter of the period the reservation was taken in (never
-- below zero; nothing when there was no reservation).
CREATE OR REPLACE FUNCTION gw_spend_release(p_key varchar, p_micros bigint, p_reserved_from timestamptz)
RETURNS void
LANGUAGE sql AS $fn$
    UPDATE key_spend s SET spent_micros = greatest(s.spent_micros - p_micros, 0)
     WHERE s.key_id = p_key AND s.period_start = p_reserved_from AND p_micros > 0
$fn$;
