-- Per-key spend limits (issue 16 item 3): the period rule and the counters of key_spend,
-- written once. Called by gw_open_calls, gw_chat_hold, gw_chat_settle and Python's
-- money.spend (the x402 open, refunds, chat releases, refusal details, key rotation).
--
-- A key with spend_limit_micros counts what it spends per spend_limit_period: day (UTC
-- midnight), week (ISO week, Monday 00:00 UTC), month (the 1st, 00:00 UTC) or total (one
-- period since 1970-01-01), in the key_spend row (key_id, period_start).
--
-- Give p_micros back to the counter of the period the reservation was taken in (never
-- below zero; nothing when there was no reservation).
CREATE OR REPLACE FUNCTION gw_spend_release(p_key varchar, p_micros bigint, p_reserved_from timestamptz)
RETURNS void
LANGUAGE sql AS $fn$
    UPDATE key_spend s SET spent_micros = greatest(s.spent_micros - p_micros, 0)
     WHERE s.key_id = p_key AND s.period_start = p_reserved_from AND p_micros > 0
$fn$;
