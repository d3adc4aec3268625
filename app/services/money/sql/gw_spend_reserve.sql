-- Per-key spend limits (issue 16 item 3): the period rule and the counters of key_spend,
-- written once. Called by gw_open_calls, gw_chat_hold, gw_chat_settle and Python's
-- money.spend (the x402 open, refunds, chat releases, refusal details, key rotation).
--
-- A key with spend_limit_micros counts what it spends per spend_limit_period: day (UTC
-- midnight), week (ISO week, Monday 00:00 UTC), month (the 1st, 00:00 UTC) or total (one
-- period since 1970-01-01), in the key_spend row (key_id, period_start).
--
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
